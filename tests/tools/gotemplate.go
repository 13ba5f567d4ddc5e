// gotemplate renders a Helm chart's templates with Go's text/template, the engine Helm uses,
// for tests: gotemplate CHART_DIR VALUES_JSON prints every template's output, separated by ---.
// Only Go's built-in template actions are available (no Sprig): the chart uses no other.
// A missing value is an error (missingkey=error), so a typo in a template cannot pass silently.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gotemplate CHART_DIR VALUES_JSON")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[2])
	check(err)
	var values map[string]interface{}
	check(json.Unmarshal(raw, &values))
	files, err := filepath.Glob(filepath.Join(os.Args[1], "templates", "*.yaml"))
	check(err)
	sort.Strings(files)
	for _, f := range files {
		text, err := os.ReadFile(f)
		check(err)
		t, err := template.New(filepath.Base(f)).Option("missingkey=error").Parse(string(text))
		check(err)
		var out strings.Builder
		check(t.Execute(&out, map[string]interface{}{"Values": values}))
		fmt.Printf("---\n# Source: %s\n%s\n", filepath.Base(f), out.String())
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "gotemplate:", err)
		os.Exit(1)
	}
}
