"""A test node agent: fake GPU nodes kept Ready, and the pods bound to them run as local processes.

No kubelet or container runtime runs on the test machines, so this agent does a kubelet's part
the way Kubernetes' scale tests and KWOK do, for a real API server, scheduler and controllers:
- it creates Node objects with the GPU capacity and labels of each sharing mode of
  deploy/cluster/manifests/gpus.py (plus one untainted CPU node), and keeps them Ready with
  Lease heartbeats in kube-node-lease and the Ready condition in their status;
- it watches the pods the real scheduler binds to its nodes and runs each container's command
  as a local process in a network namespace of the pod's own (a veth on a bridge the agent
  makes): EndpointSlices refuse loopback addresses, and every replica listens on 0.0.0.0:8080;
- a private mount namespace per pod maps the volumes (emptyDir, the artifacts PVC to a local
  directory, the service-account token from TokenRequest) and makes the root read-only when
  the container asks; the process runs as the pod's runAsUser/runAsGroup with no new privileges;
- it probes readiness/startup/liveness itself and writes the pod's status as a kubelet would, so
  the real endpointslice controller publishes the pod; on deletion it stops the processes
  (SIGTERM, SIGKILL after the grace period) and deletes the pod object with grace 0.
Not done: seccomp, cgroup limits, images (an image maps to a local command, --image), exec/logs.
This is a test helper: Shoal's packages must not import it. Everything has a timeout; the agent
exits when its pid file goes (down.sh) or the API server has been gone for --api-gone-s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from deploy.cluster.manifests.gpus import GPUS, MODES, Sharing  # noqa: E402

NODE_LABEL = "shoal.dev/test-node"
HEARTBEAT_S = 10
STATUS_EVERY_S = 60
WATCH_TIMEOUT_S = 60
REQUEST_TIMEOUT_S = 10
TICK_S = 0.5


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------------------------
# Nodes: what each sharing mode's device plugin advertises (pure)
# ---------------------------------------------------------------------------------------------

def node_specs(nodes_per_mode: int, gpu: str = "A100-80GB", gpus_per_node: int = 2) -> list[dict]:
    """Node objects: `nodes_per_mode` per GPU sharing mode, tainted nvidia.com/gpu, and one CPU node."""
    sharing = Sharing(gpu=gpu)
    nodes = [_node("cpu-0", {}, {}, taint=False)]
    for mode in MODES:
        capacity, labels = gpu_capacity(mode, sharing, gpus_per_node)
        nodes += [_node(f"{mode}-{i}", capacity, labels, taint=True) for i in range(nodes_per_mode)]
    return nodes


def gpu_capacity(mode: str, sharing: Sharing, gpus: int) -> tuple[dict[str, str], dict[str, str]]:
    """The extended resources and labels a node with `gpus` GPUs has in `mode`."""
    g = GPUS[sharing.gpu]
    product = {"A100-80GB": "NVIDIA-A100-SXM4-80GB"}.get(g.name, f"NVIDIA-{g.name}")
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.product": product}
    if mode == "hami":
        # HAMi splits each card into deviceSplitCount (10) vGPUs, its memory in MiB, 100 cores per card.
        return ({"nvidia.com/gpu": str(10 * gpus), "nvidia.com/gpumem": str(g.memory_mib * gpus),
                 "nvidia.com/gpucores": str(100 * gpus)}, {**labels, "gpu": "on"})
    if mode in ("timeslice", "mps"):
        strategy = "time-slicing" if mode == "timeslice" else "mps"
        return ({"nvidia.com/gpu": str(sharing.ways * gpus)},
                {**labels, "nvidia.com/gpu.replicas": str(sharing.ways), "nvidia.com/gpu.sharing-strategy": strategy,
                 "nvidia.com/gpu.product": f"{product}-SHARED"})
    if mode == "mig":
        # mig.strategy=mixed: every profile of the model, two of each per card (a made-up layout).
        return ({f"nvidia.com/mig-{p.name}": str(2 * gpus) for p in g.mig},
                {**labels, "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-balanced"})
    # vgpu: each VM gets one profile; the 1/4 one (20 GB of an A100-80GB) for the example's slice.
    fb = g.memory_mib // 1024 // 4
    return ({"nvidia.com/gpu": str(gpus)}, {**labels, "nvidia.com/gpu.product": f"GRID-{g.family}-{fb}C"})


def _node(name: str, gpu: dict[str, str], labels: dict[str, str], taint: bool) -> dict:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi", **gpu}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            NODE_LABEL: "true", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "shoal-test", **labels}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if taint else []},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def node_status(node: dict, address: str) -> dict:
    """The status a kubelet reports: Ready, no pressure, addresses, versions."""
    t = now_iso()

    def cond(type_: str, status: str, reason: str) -> dict:
        return {"type": type_, "status": status, "reason": reason, "message": reason,
                "lastHeartbeatTime": t, "lastTransitionTime": t}

    return {"status": {
        **node["status"],
        "conditions": [cond("Ready", "True", "KubeletReady"), cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                       cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                       cond("PIDPressure", "False", "KubeletHasSufficientPID")],
        "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": node["metadata"]["name"]}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"kubeletVersion": "v1.37.2-shoal-node-agent", "kubeProxyVersion": "", "osImage": "shoal test node",
                     "kernelVersion": os.uname().release, "operatingSystem": "linux", "architecture": "amd64",
                     "containerRuntimeVersion": "shoal-node-agent://0", "machineID": "", "systemUUID": "", "bootID": ""},
    }}


# ---------------------------------------------------------------------------------------------
# The API: a thin JSON client over the kubernetes package's configuration (TLS, certs)
# ---------------------------------------------------------------------------------------------

class Api:
    """JSON over HTTPS with the kubeconfig's TLS client certificate (urllib3: the kubernetes
    package's generated client is more than a kubelet's few calls need)."""

    def __init__(self, kubeconfig: str):
        import urllib3
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.host = cfg.host
        self.headers = {"Accept": "application/json", **({"Authorization": cfg.api_key["authorization"]}
                                                          if cfg.api_key.get("authorization") else {})}
        self.pool = urllib3.PoolManager(num_pools=4, maxsize=16, cert_reqs="CERT_REQUIRED", ca_certs=cfg.ssl_ca_cert,
                                        cert_file=cfg.cert_file, key_file=cfg.key_file)

    def request(self, method: str, path: str, body=None, content_type: str = "application/json",
                query: list | None = None, timeout: float = REQUEST_TIMEOUT_S, stream: bool = False):
        import urllib.parse

        url = self.host + path + ("?" + urllib.parse.urlencode(query) if query else "")
        return self.pool.request(method, url, body=None if body is None else json.dumps(body),
                                 headers={**self.headers, "Content-Type": content_type},
                                 timeout=timeout, preload_content=not stream, retries=False)

    def call(self, method: str, path: str, body=None, **kw):
        """One request; returns (status, parsed body). Raises only for a transport error."""
        resp = self.request(method, path, body, **kw)
        try:
            data = json.loads(resp.data) if resp.data else None
        except ValueError:
            data = resp.data[:300]
        return resp.status, data

    def ok(self, method: str, path: str, body=None, **kw):
        status, data = self.call(method, path, body, **kw)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {str(data)[:300]}")
        return data


# ---------------------------------------------------------------------------------------------
# Pod networking: a bridge per cluster, a netns + veth per pod
# ---------------------------------------------------------------------------------------------

def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


class PodNet:
    def __init__(self, cidr: str, tag: str):
        self.prefix = cidr.split(".0.0/")[0]  # "10.200"
        self.gateway = f"{self.prefix}.0.1"
        self.bridge = f"sb{tag}"
        self.tag = tag
        self.lock = threading.Lock()
        self.used: set[int] = set()

    def up(self) -> None:
        self.down()
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/16", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def down(self) -> None:
        for ns in sh("ip", "netns", "list", check=False).stdout.split():
            if ns.startswith(f"shoal-{self.tag}-"):
                sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    def add(self) -> tuple[str, str]:
        """A new pod network: (netns name, pod IP)."""
        with self.lock:
            n = next(i for i in range(2, 65000) if i not in self.used)
            self.used.add(n)
        ns, ip = f"shoal-{self.tag}-{n}", f"{self.prefix}.{n // 256 + 1}.{n % 256}"
        host_if = f"sv{self.tag}{n:04x}"[:15]
        sh("ip", "link", "del", host_if, check=False)  # a veth of an earlier pod, if its netns lingers
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", host_if, "master", self.bridge, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", self.gateway)
        return ns, ip

    def remove(self, ns: str) -> None:
        n = int(ns.rsplit("-", 1)[1])
        sh("ip", "link", "del", f"sv{self.tag}{n:04x}"[:15], check=False)  # at once, not when the netns is freed
        sh("ip", "netns", "del", ns, check=False)
        with self.lock:
            self.used.discard(n)


class ApiForwarder:
    """The API server listens on 127.0.0.1 only; pods reach it at the bridge's address (a
    TCP relay, TLS passes through: the serving cert names that address)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], stop: threading.Event):
        self.target, self.stop = target, stop
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(listen)
        self.sock.listen(64)
        self.sock.settimeout(1)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                conn.close()
                continue
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(600)  # an idle watch longer than this is cut; clients reconnect
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------------
# Pods
# ---------------------------------------------------------------------------------------------

@dataclass
class Probe:
    spec: dict
    failures: int = 0
    successes: int = 0
    last: float = 0.0
    passed: bool = False  # for readiness: the current verdict; for startup: ever passed


@dataclass
class Container:
    spec: dict
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started_at: str = ""
    exit_code: int | None = None
    finished_at: str = ""
    reason: str = ""
    message: str = ""
    next_start: float = 0.0
    t0: float = 0.0  # monotonic start of the process, for initialDelaySeconds
    probes: dict[str, Probe] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec["name"]


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env; $$ escapes."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


class PodRun:
    """One pod on one of the agent's nodes: its network, volumes, processes, probes and status."""

    def __init__(self, agent: "Agent", pod: dict):
        self.agent, self.pod = agent, pod
        meta = pod["metadata"]
        self.ns_name, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = agent.dir / "pods" / f"{self.ns_name}_{self.name}_{self.uid[:8]}"
        self.stage = agent.stage / self.dir.name  # outside any mount target, see start()
        self.netns = self.ip = ""
        self.initialized = False
        self.inits = [Container(c) for c in pod["spec"].get("initContainers", [])]
        self.containers = [Container(c) for c in pod["spec"]["containers"]]
        self.stop_requested = threading.Event()
        self.done = threading.Event()
        self.last_status: dict | None = None
        self.phase = "Pending"
        self.error = ""

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.ns_name}/pods/{self.name}"

    # --- lifecycle ---

    def run(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.netns, self.ip = self.agent.net.add()
            while not self.mount_volumes():  # a kubelet retries a mount (a Secret made later)
                if self.stop_requested.wait(5) or self.agent.stopping.is_set():
                    return
            self.write_status()
            while not self.stop_requested.is_set() and not self.agent.stopping.is_set():
                self.tick()
                self.write_status()
                self.stop_requested.wait(TICK_S)
        except Exception as e:  # noqa: BLE001 -- a pod's failure must not stop the agent
            self.error = f"{type(e).__name__}: {e}"
            self.agent.log(f"pod {self.ns_name}/{self.name}: {self.error}")
            self.write_status()
            self.stop_requested.wait(300)
        finally:
            self.stop_all(self.grace_s())
            if self.netns:
                self.agent.net.remove(self.netns)
            shutil.rmtree(self.stage, ignore_errors=True)
            self.done.set()

    def grace_s(self) -> float:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        g = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30))
        return 2.0 if self.agent.stopping.is_set() else float(g)

    def tick(self) -> None:
        if not self.initialized:
            self.run_inits()
            return
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for c in self.containers:
            if c.proc is None:
                if c.exit_code is None or (policy == "Always" or (policy == "OnFailure" and c.exit_code != 0)):
                    if time.monotonic() >= c.next_start:
                        self.start(c)
                continue
            rc = c.proc.poll()
            if rc is not None:
                self.exited(c, rc)
                continue
            self.probe(c)
        if policy != "Always" and all(c.proc is None and c.exit_code is not None for c in self.containers):
            failed = any(c.exit_code for c in self.containers)
            if policy == "Never" or not failed:
                self.phase = "Failed" if failed else "Succeeded"

    def run_inits(self) -> None:
        for c in self.inits:
            if c.exit_code == 0:
                continue
            if time.monotonic() < c.next_start:
                return
            self.start(c)
            try:
                rc = c.proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                self.kill(c.proc, 1)
                rc = -9
            self.exited(c, rc)
            if rc != 0:
                return
        self.initialized = True

    def exited(self, c: Container, rc: int) -> None:
        c.proc, c.exit_code, c.finished_at = None, rc, now_iso()
        c.reason = "Completed" if rc == 0 else "Error"
        backoff = min(30.0, 1.0 * 2 ** min(c.restarts, 5))
        c.next_start = time.monotonic() + backoff
        for p in c.probes.values():
            p.failures = p.successes = 0
            p.passed = False

    # --- processes ---

    def argv(self, c: Container, env: dict[str, str]) -> list[str] | None:
        spec = c.spec
        command = spec.get("command")
        if not command:
            entry = self.agent.entrypoint(spec.get("image", ""))
            if entry is None:
                return None
            command = entry
        return [expand(a, env) for a in list(command) + list(spec.get("args", []))]

    def env(self, c: Container) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "PYTHONUNBUFFERED": "1",
               "PYTHONDONTWRITEBYTECODE": "1", "HOSTNAME": self.name,
               "KUBERNETES_SERVICE_HOST": self.agent.net.gateway, "KUBERNETES_SERVICE_PORT": "443"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        for e in c.spec.get("env", []) or []:
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif "valueFrom" in e:
                env[e["name"]] = self.value_from(e["valueFrom"])
        return env

    def value_from(self, src: dict) -> str:
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            fields = {"metadata.name": self.name, "metadata.namespace": self.ns_name, "metadata.uid": self.uid,
                      "spec.nodeName": self.pod["spec"].get("nodeName", ""),
                      "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", ""),
                      "status.podIP": self.ip, "status.hostIP": self.agent.net.gateway}
            m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if m:
                return self.pod["metadata"].get(m.group(1), {}).get(m.group(2), "")
            return fields.get(path, "")
        for kind, key in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            if kind in src:
                ref = src[kind]
                status, obj = self.agent.api.call("GET", f"/api/v1/namespaces/{self.ns_name}/{key}/{ref['name']}")
                data = (obj or {}).get("data", {}) if status == 200 else {}
                value = data.get(ref["key"], "")
                if key == "secrets" and value:
                    import base64
                    value = base64.b64decode(value).decode()
                return value
        return ""

    def start(self, c: Container) -> None:
        env = self.env(c)
        argv = self.argv(c, env)
        if c.finished_at:
            c.restarts += 1
        c.started_at, c.exit_code, c.finished_at = now_iso(), None, ""
        if argv is None:
            c.reason, c.message = "ErrImageNeverPull", f"the node agent runs no image: {c.spec.get('image')!r} " \
                                                        "has no local command (node_agent.py --image)"
            c.next_start = time.monotonic() + 30
            return
        sc = {**self.pod["spec"].get("securityContext", {}), **(c.spec.get("securityContext") or {})}
        mounts = [m for v in c.spec.get("volumeMounts", []) if (m := self.mount_for(v))]
        drop = ["setpriv"]
        uid, gid = sc.get("runAsUser"), sc.get("runAsGroup", sc.get("runAsUser"))
        if uid is not None:
            groups = [str(g) for g in [self.pod["spec"].get("securityContext", {}).get("fsGroup")] if g is not None]
            drop += [f"--reuid={uid}", f"--regid={gid}"]
            drop += [f"--groups={','.join(groups)}"] if groups else ["--clear-groups"]
        if sc.get("allowPrivilegeEscalation") is False:
            drop += ["--no-new-privs"]
        if "ALL" in ((sc.get("capabilities") or {}).get("drop") or []):
            drop += ["--inh-caps=-all", "--bounding-set=-all"]
        drop += ["--"]
        # Two passes: every source is bound to a staging directory first, since a target such as
        # /tmp would hide a source under it (the pod's own directory) from a later mount.
        script = ('set -e; stage="$1"; shift; n=0; while [ "$1" != "--" ]; do n=$((n+1)); mkdir -p "$stage/$n"; '
                  'mount --bind "$1" "$stage/$n"; eval "dst_$n=\\$2 mode_$n=\\$3"; shift 3; done; shift; i=0; '
                  'while [ $i -lt $n ]; do i=$((i+1)); eval "d=\\$dst_$i m=\\$mode_$i"; mkdir -p "$d"; '
                  'mount --bind "$stage/$i" "$d"; if [ "$m" = ro ]; then mount -o remount,bind,ro "$d"; fi; done; '
                  'if [ "$1" = ro-root ]; then mount -o remount,bind,ro /; fi; shift; cd "$1"; shift; exec "$@"')
        flat = [str(self.stage / c.name)] + [x for m in mounts for x in m]
        workdir = c.spec.get("workingDir") or "/"
        cmd = ["nsenter", f"--net=/run/netns/{self.netns}", "--", "unshare", "--mount", "--propagation", "private",
               "--", "/bin/sh", "-c", script, "sh", *flat, "--",
               "ro-root" if sc.get("readOnlyRootFilesystem") else "rw-root", workdir, *drop, *argv]
        log = open(self.dir / f"{c.name}.log", "ab")
        c.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        log.close()
        (self.dir / f"{c.name}.pid").write_text(str(c.proc.pid))
        c.reason, c.message, c.t0 = "", "", time.monotonic()
        c.probes = {k: Probe(c.spec[k]) for k in ("startupProbe", "readinessProbe", "livenessProbe") if c.spec.get(k)}

    def kill(self, proc: subprocess.Popen, grace_s: float) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=max(grace_s, 0.1))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group: whatever it left behind too
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.agent.log(f"pid {proc.pid} survived SIGKILL")

    def stop_all(self, grace_s: float) -> None:
        procs = [c.proc for c in self.inits + self.containers if c.proc is not None]
        threads = [threading.Thread(target=self.kill, args=(p, grace_s)) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(grace_s + 15)

    # --- volumes ---

    def mount_volumes(self) -> bool:
        try:
            self.mounts = self.volumes()
        except (RuntimeError, OSError) as e:
            if self.error != str(e):
                self.agent.log(f"pod {self.ns_name}/{self.name}: FailedMount: {e}")
            self.error = str(e)
            self.write_status()
            return False
        self.error = ""
        return True

    def volumes(self) -> dict[str, tuple[str, bool]]:
        """Each volume's local directory, and whether it is read-only whatever the mount says."""
        out: dict[str, tuple[str, bool]] = {}
        fs_group = self.pod["spec"].get("securityContext", {}).get("fsGroup")
        for v in self.pod["spec"].get("volumes", []):
            d = self.dir / "volumes" / v["name"]
            if "emptyDir" in v:
                d.mkdir(parents=True, exist_ok=True)
                d.chmod(0o1777 if fs_group is None else 0o2775)
                if fs_group is not None:
                    os.chown(d, 0, fs_group)
                out[v["name"]] = (str(d), False)
            elif "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                if claim != self.agent.artifacts_claim:
                    raise RuntimeError(f"volume {v['name']}: the agent maps only the PVC "
                                       f"{self.agent.artifacts_claim!r}, not {claim!r}")
                out[v["name"]] = (str(self.agent.artifacts), bool(v["persistentVolumeClaim"].get("readOnly")))
            elif "projected" in v or "configMap" in v or "secret" in v:
                d.mkdir(parents=True, exist_ok=True)
                self.write_projected(v, d)
                out[v["name"]] = (str(d), True)
            else:
                raise RuntimeError(f"volume {v['name']}: kind {sorted(set(v) - {'name'})} is not supported by the agent")
        return out

    def write_projected(self, v: dict, d: Path) -> None:
        sources = v["projected"]["sources"] if "projected" in v else [v]
        for s in sources:
            if "serviceAccountToken" in s:
                t = s["serviceAccountToken"]
                body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"audiences": [t["audience"]] if t.get("audience") else None,
                                 "expirationSeconds": t.get("expirationSeconds", 3607),
                                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name,
                                                    "uid": self.uid}}}
                sa = self.pod["spec"].get("serviceAccountName", "default")
                tr = self.agent.api.ok("POST", f"/api/v1/namespaces/{self.ns_name}/serviceaccounts/{sa}/token", body)
                self.write_file(d / t.get("path", "token"), tr["status"]["token"])
            for kind, key in (("configMap", "configmaps"), ("secret", "secrets")):
                if kind in s:
                    ref = s[kind]
                    name = ref.get("name") or ref.get("secretName")
                    status, obj = self.agent.api.call("GET", f"/api/v1/namespaces/{self.ns_name}/{key}/{name}")
                    if status != 200 and not ref.get("optional"):  # a kubelet waits: FailedMount
                        raise RuntimeError(f"volume {v['name']}: {kind} {name!r}: {status}")
                    data = (obj or {}).get("data", {}) if status == 200 else {}
                    items = ref.get("items") or [{"key": k, "path": k} for k in data]
                    for it in items:
                        value = data.get(it["key"], "")
                        if kind == "secret":
                            import base64
                            value = base64.b64decode(value).decode()
                        self.write_file(d / it["path"], value)
            if "downwardAPI" in s:
                for it in s["downwardAPI"]["items"]:
                    if "fieldRef" in it:
                        self.write_file(d / it["path"], self.value_from({"fieldRef": it["fieldRef"]}))

    @staticmethod
    def write_file(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)

    def mount_for(self, vm: dict) -> tuple[str, str, str] | None:
        src, ro = self.mounts[vm["name"]]
        if vm.get("subPath"):
            src = os.path.join(src, vm["subPath"])
        return (src, vm["mountPath"], "ro" if ro or vm.get("readOnly") else "rw")

    # --- probes ---

    def probe(self, c: Container) -> None:
        now = time.monotonic()
        for kind, p in c.probes.items():
            startup = c.probes.get("startupProbe")
            if kind != "startupProbe" and startup is not None and not startup.passed:
                continue
            if kind == "startupProbe" and p.passed:
                continue
            period = p.spec.get("periodSeconds", 10)
            if p.last and now - p.last < period:
                continue
            if not p.last and now - c.t0 < p.spec.get("initialDelaySeconds", 0):
                continue
            p.last = now
            ok = self.http_probe(c, p.spec)
            if ok:
                p.successes, p.failures = p.successes + 1, 0
                if p.successes >= p.spec.get("successThreshold", 1):
                    p.passed = True
            else:
                p.failures, p.successes = p.failures + 1, 0
                if p.failures >= p.spec.get("failureThreshold", 3):
                    p.passed = False
                    if kind in ("livenessProbe", "startupProbe"):
                        self.agent.log(f"pod {self.ns_name}/{self.name} container {c.name}: {kind} failed, restarting")
                        self.kill(c.proc, self.grace_s())
                        self.exited(c, -15)
                        c.reason = "Unhealthy"
                        return

    def http_probe(self, c: Container, spec: dict) -> bool:
        get = spec.get("httpGet")
        if get is None:
            if "tcpSocket" in spec:
                try:
                    socket.create_connection((self.ip, self.port(c, spec["tcpSocket"]["port"])),
                                             timeout=spec.get("timeoutSeconds", 1)).close()
                    return True
                except OSError:
                    return False
            return True  # exec probes: the agent cannot run them in the container; counted as passing
        conn = http.client.HTTPConnection(self.ip, self.port(c, get["port"]), timeout=spec.get("timeoutSeconds", 1))
        try:
            conn.request("GET", get.get("path", "/"))
            return 200 <= conn.getresponse().status < 400
        except OSError:
            return False
        finally:
            conn.close()

    @staticmethod
    def port(c: Container, port) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        raise RuntimeError(f"container {c.name}: no port named {port!r}")

    # --- status ---

    def container_status(self, c: Container, init: bool) -> dict:
        st: dict = {"name": c.name, "image": c.spec.get("image", ""), "imageID": "", "restartCount": c.restarts}
        if c.proc is not None:
            ready = all(p.passed for k, p in c.probes.items() if k != "livenessProbe") if not init else False
            st |= {"state": {"running": {"startedAt": c.started_at}}, "ready": ready,
                   "started": c.probes.get("startupProbe", Probe({}, passed=True)).passed,
                   "containerID": f"shoal-node-agent://{c.proc.pid}"}
        elif c.exit_code is not None:
            st |= {"state": {"terminated": {"exitCode": c.exit_code, "reason": c.reason, "startedAt": c.started_at,
                                            "finishedAt": c.finished_at}},
                   "ready": False, "started": False}
            if not init and self.pod["spec"].get("restartPolicy", "Always") != "Never" and c.exit_code != 0:
                st["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                           "message": f"exit code {c.exit_code}; see {self.dir}/{c.name}.log"}}
        else:
            st |= {"state": {"waiting": {"reason": c.reason or ("PodInitializing" if not init else "Waiting"),
                                         **({"message": c.message} if c.message else {})}},
                   "ready": False, "started": False}
        return st

    def status(self) -> dict:
        containers = [self.container_status(c, False) for c in self.containers]
        ready = self.initialized and all(s["ready"] for s in containers)
        if self.phase == "Pending" and self.initialized and any(c.proc is not None for c in self.containers):
            self.phase = "Running"

        def cond(type_: str, ok: bool, reason: str = "") -> dict:
            return {"type": type_, "status": "True" if ok else "False", **({"reason": reason} if reason else {})}

        status = {
            "phase": self.phase, "hostIP": self.agent.net.gateway, "hostIPs": [{"ip": self.agent.net.gateway}],
            "conditions": [cond("PodReadyToStartContainers", bool(self.ip)),
                           cond("Initialized", self.initialized, "" if self.initialized else "ContainersNotInitialized"),
                           cond("ContainersReady", ready, "" if ready else "ContainersNotReady"),
                           cond("Ready", ready, "" if ready else "ContainersNotReady")],
            "containerStatuses": containers,
            "initContainerStatuses": [self.container_status(c, True) for c in self.inits],
        }
        if self.ip:
            status |= {"podIP": self.ip, "podIPs": [{"ip": self.ip}]}
        if self.error:
            status |= {"reason": "NodeAgentError", "message": self.error}
        else:
            status |= {"reason": None, "message": None}  # strategic merge: clear an old error
        return status

    def write_status(self) -> None:
        status = self.status()
        if status == self.last_status:
            return
        stamped = json.loads(json.dumps(status))
        t = now_iso()
        for c in stamped["conditions"]:
            c["lastTransitionTime"] = t  # only written on a change, so close enough
        if self.last_status is None:
            stamped["startTime"] = t
        code, data = self.agent.api.call("PATCH", f"{self.path}/status", {"status": stamped},
                                         content_type="application/strategic-merge-patch+json")
        if code < 300:
            self.last_status = status
        elif code != 404:
            self.agent.log(f"pod {self.ns_name}/{self.name}: status {code} {str(data)[:300]}")


# ---------------------------------------------------------------------------------------------
# The agent
# ---------------------------------------------------------------------------------------------

class Agent:
    def __init__(self, args: argparse.Namespace):
        self.dir = Path(args.dir)
        self.api = Api(args.kubeconfig)
        self.nodes = node_specs(args.nodes_per_mode)
        self.node_names = {n["metadata"]["name"] for n in self.nodes}
        self.net = PodNet(args.pod_net, args.tag)
        self.artifacts = Path(args.artifacts)
        self.artifacts_claim = args.artifacts_claim
        self.images = dict(i.split("=", 1) for i in args.image)
        self.api_target = tuple(args.api.rsplit(":", 1))
        self.api_gone_s = args.api_gone_s
        self.pid_file = self.dir / "node-agent.pid"
        self.stage = Path(f"/run/shoal-{args.tag}")  # empty mount points for the pods' two-pass mounts
        self.stopping = threading.Event()
        self.pods: dict[str, PodRun] = {}
        self.lock = threading.Lock()
        self.log_lock = threading.Lock()

    def log(self, msg: str) -> None:
        with self.log_lock:
            print(f"{now_iso()} node-agent: {msg}", file=sys.stderr, flush=True)

    def entrypoint(self, image: str) -> list[str] | None:
        """A local command for an image: the longest --image PREFIX=COMMAND that matches."""
        for prefix in sorted(self.images, key=len, reverse=True):
            if image.startswith(prefix):
                return self.images[prefix].split()
        return None

    # --- main ---

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        self.net.up()
        ApiForwarder((self.net.gateway, 443), (self.api_target[0], int(self.api_target[1])), self.stopping)
        try:
            self.register_nodes()
            for target in (self.heartbeat_loop, self.watch_loop):
                threading.Thread(target=target, daemon=True).start()
            while not self.stopping.wait(1):
                if not self.owner_alive():
                    self.log("pid file gone: exiting")
                    self.stopping.set()
        finally:
            self.shutdown()

    def owner_alive(self) -> bool:
        try:
            return int(self.pid_file.read_text()) == os.getpid()
        except (OSError, ValueError):
            return False

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            runs = list(self.pods.values())
        for r in runs:
            r.stop_requested.set()
        for r in runs:
            r.done.wait(30)
        self.net.down()
        shutil.rmtree(self.stage, ignore_errors=True)
        self.log("stopped")

    # --- nodes ---

    def register_nodes(self) -> None:
        for node in self.nodes:
            name = node["metadata"]["name"]
            body = {k: v for k, v in node.items() if k != "status"}
            code, data = self.api.call("POST", "/api/v1/nodes", body)
            if code not in (201, 409):
                raise RuntimeError(f"create node {name}: {code} {data}")
            self.api.ok("PATCH", f"/api/v1/nodes/{name}/status", node_status(node, self.net.gateway),
                        content_type="application/strategic-merge-patch+json")
            self.renew_lease(name)
        self.log(f"nodes registered: {', '.join(sorted(self.node_names))}")

    def renew_lease(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
        code, _ = self.api.call("PATCH", path, {"spec": spec}, content_type="application/merge-patch+json")
        if code == 404:
            node_uid = self.api.ok("GET", f"/api/v1/nodes/{name}")["metadata"]["uid"]
            self.api.ok("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]},
                "spec": spec})

    def heartbeat_loop(self) -> None:
        last_status, last_ok = 0.0, time.monotonic()
        while not self.stopping.is_set():
            try:
                for node in self.nodes:
                    self.renew_lease(node["metadata"]["name"])
                if time.monotonic() - last_status >= STATUS_EVERY_S:
                    for node in self.nodes:
                        self.api.ok("PATCH", f"/api/v1/nodes/{node['metadata']['name']}/status",
                                    node_status(node, self.net.gateway),
                                    content_type="application/strategic-merge-patch+json")
                    last_status = time.monotonic()
                last_ok = time.monotonic()
            except Exception as e:  # noqa: BLE001 -- keep beating; give up only after api_gone_s
                self.log(f"heartbeat: {e}")
                if time.monotonic() - last_ok > self.api_gone_s:
                    self.log(f"API unreachable for {self.api_gone_s}s: exiting")
                    self.stopping.set()
            self.stopping.wait(HEARTBEAT_S)

    # --- pods ---

    def watch_loop(self) -> None:
        version = ""
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self.resync()
                version = self.watch(version)
            except Exception as e:  # noqa: BLE001 -- relist after a pause
                self.log(f"watch: {e}")
                version = ""
                self.stopping.wait(1)

    def resync(self) -> str:
        pods = self.api.ok("GET", "/api/v1/pods")
        live = set()
        for pod in pods["items"]:
            if pod["spec"].get("nodeName") in self.node_names:
                live.add(pod["metadata"]["uid"])
                self.on_pod(pod)
        with self.lock:
            gone = [r for uid, r in self.pods.items() if uid not in live]
        for r in gone:
            self.on_gone(r.pod)
        return pods["metadata"]["resourceVersion"]

    def watch(self, version: str) -> str:
        """One watch call of at most WATCH_TIMEOUT_S; returns the version to go on from ('' = relist)."""
        query = [("watch", "true"), ("resourceVersion", version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(WATCH_TIMEOUT_S))]
        resp = self.api.request("GET", "/api/v1/pods", query=query, timeout=WATCH_TIMEOUT_S + 10, stream=True)
        if resp.status != 200:
            resp.release_conn()
            return ""
        try:
            for line in iter_lines(resp):
                if self.stopping.is_set():
                    break
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    return ""  # 410 Gone and friends: relist
                version = obj["metadata"].get("resourceVersion", version)
                if event["type"] == "BOOKMARK" or obj["spec"].get("nodeName") not in self.node_names:
                    continue
                if event["type"] == "DELETED":
                    self.on_gone(obj)
                else:
                    self.on_pod(obj)
        finally:
            resp.release_conn()
        return version

    def on_pod(self, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            run = self.pods.get(uid)
            if run is None and not pod["metadata"].get("deletionTimestamp") \
                    and pod["status"].get("phase") not in ("Succeeded", "Failed"):
                run = self.pods[uid] = PodRun(self, pod)
                threading.Thread(target=run.run, daemon=True).start()
                self.log(f"pod {run.ns_name}/{run.name} on {pod['spec']['nodeName']}: starting")
                return
        if run is None:
            if pod["metadata"].get("deletionTimestamp"):
                threading.Thread(target=self.finish_delete, args=(None, pod), daemon=True).start()
            return
        run.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not run.stop_requested.is_set():
            run.stop_requested.set()
            threading.Thread(target=self.finish_delete, args=(run, pod), daemon=True).start()

    def finish_delete(self, run: PodRun | None, pod: dict) -> None:
        """As a kubelet: once the processes have stopped, delete the pod object for good (grace 0)."""
        if run is not None:
            run.done.wait(run.grace_s() + 30)
            shutil.rmtree(run.dir / "volumes", ignore_errors=True)
        meta = pod["metadata"]
        self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                      {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        with self.lock:
            self.pods.pop(meta["uid"], None)
        self.log(f"pod {meta['namespace']}/{meta['name']}: deleted")

    def on_gone(self, pod: dict) -> None:
        with self.lock:
            run = self.pods.pop(pod["metadata"]["uid"], None)
        if run is not None:
            run.stop_requested.set()


def iter_lines(resp):
    """The lines of a streamed response (a watch: one JSON event a line)."""
    buf = b""
    for chunk in resp.stream(65536, decode_content=True):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line


def check_ready(kubeconfig: str, nodes_per_mode: int) -> bool:
    """True when every node of the agent exists and is Ready (up.sh waits on this)."""
    api = Api(kubeconfig)
    code, data = api.call("GET", "/api/v1/nodes", query=[("labelSelector", f"{NODE_LABEL}=true")])
    if code != 200:
        return False
    want = {n["metadata"]["name"] for n in node_specs(nodes_per_mode)}
    ready = {n["metadata"]["name"] for n in data["items"]
             if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
    return want <= ready


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="the cluster's directory (up.sh DIR)")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes-per-mode", type=int, default=1)
    p.add_argument("--check-ready", action="store_true", help="exit 0 if all nodes are Ready, else 1")
    p.add_argument("--pod-net", default="10.244.0.0/16")
    p.add_argument("--tag", default="test")
    p.add_argument("--api", default="127.0.0.1:6443", help="the API server's HOST:PORT, forwarded to pods")
    p.add_argument("--artifacts", default="", help="the local directory behind the artifacts PVC")
    p.add_argument("--artifacts-claim", default="shoal-artifacts")
    p.add_argument("--image", action="append",
                   default=[f"ghcr.io/shoal-dev/shoal={sys.executable} -m deploy.cli"],
                   help="IMAGE_PREFIX=COMMAND: the local command for an image's entrypoint (repeatable)")
    p.add_argument("--api-gone-s", type=float, default=60)
    args = p.parse_args(argv)
    if args.check_ready:
        return 0 if check_ready(args.kubeconfig, args.nodes_per_mode) else 1
    Agent(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
