"""The SQLite registry of functions, their revisions, artifacts and events. It survives restarts
(after `shoal up` again every function is back, scaled to zero, with no re-deploy); every write
is one transaction, and times are passed in (`now`), never read here.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from functions.artifacts import Artifact
from functions.spec import FunctionSpec, spec_from_dict, spec_to_dict

SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    ref TEXT PRIMARY KEY, digest TEXT NOT NULL, filename TEXT NOT NULL, size INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS functions (
    name TEXT PRIMARY KEY, revision INTEGER NOT NULL, spec TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS revisions (
    name TEXT NOT NULL, revision INTEGER NOT NULL, spec TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (name, revision)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, function TEXT, kind TEXT NOT NULL,
    message TEXT NOT NULL, data TEXT
);
CREATE INDEX IF NOT EXISTS events_function ON events (function, id);
"""


class NotFound(KeyError):
    pass


@dataclass(frozen=True, slots=True)
class FunctionRecord:
    spec: FunctionSpec
    revision: int
    created_at: float
    updated_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            **spec_to_dict(self.spec), "revision": self.revision,
            "created_at": self.created_at, "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    at: float
    function: str | None
    kind: str
    message: str
    data: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "at": self.at, "function": self.function, "kind": self.kind,
                "message": self.message, "data": self.data}


class Registry:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ artifacts

    def add_artifact(self, artifact: Artifact, now: float) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO artifacts (ref, digest, filename, size, created_at) VALUES (?, ?, ?, ?, ?)",
            (artifact.ref, artifact.digest, artifact.filename, artifact.size, now),
        )

    # ------------------------------------------------------------------ functions

    def put_function(self, spec: FunctionSpec, now: float) -> FunctionRecord:
        """Create or update; an update that changes the spec makes a new revision."""
        doc = json.dumps(spec_to_dict(spec), sort_keys=True)
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute("SELECT revision, spec, created_at FROM functions WHERE name = ?", (spec.name,)).fetchone()
            if row and row[1] == doc:
                return self.get_function(spec.name)
            # revisions are never reused, even after the function was deleted and deployed again
            last = self.db.execute("SELECT MAX(revision) FROM revisions WHERE name = ?", (spec.name,)).fetchone()[0]
            revision = (last or 0) + 1
            created = row[2] if row else now
            self.db.execute(
                "INSERT OR REPLACE INTO functions (name, revision, spec, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                (spec.name, revision, doc, created, now),
            )
            self.db.execute(
                "INSERT INTO revisions (name, revision, spec, created_at) VALUES (?, ?, ?, ?)",
                (spec.name, revision, doc, now),
            )
        return FunctionRecord(spec, revision, created, now)

    def get_function(self, name: str) -> FunctionRecord:
        row = self.db.execute(
            "SELECT spec, revision, created_at, updated_at FROM functions WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise NotFound(name)
        return FunctionRecord(spec_from_dict(json.loads(row[0])), row[1], row[2], row[3])

    def list_functions(self) -> list[FunctionRecord]:
        rows = self.db.execute("SELECT spec, revision, created_at, updated_at FROM functions ORDER BY name").fetchall()
        return [FunctionRecord(spec_from_dict(json.loads(r[0])), r[1], r[2], r[3]) for r in rows]

    def delete_function(self, name: str) -> None:
        with self.db:
            cur = self.db.execute("DELETE FROM functions WHERE name = ?", (name,))
            if cur.rowcount == 0:
                raise NotFound(name)

    def revisions(self, name: str) -> list[int]:
        return [r[0] for r in self.db.execute("SELECT revision FROM revisions WHERE name = ? ORDER BY revision", (name,))]

    # ------------------------------------------------------------------ events

    def add_event(self, now: float, kind: str, message: str, function: str | None = None,
                  data: dict[str, Any] | None = None) -> int:
        cur = self.db.execute(
            "INSERT INTO events (at, function, kind, message, data) VALUES (?, ?, ?, ?, ?)",
            (now, function, kind, message, json.dumps(data) if data is not None else None),
        )
        return int(cur.lastrowid)

    def events(self, function: str | None = None, after_id: int = 0, limit: int = 200) -> list[Event]:
        """Events in order: after `after_id` the next `limit` (paging never skips one);
        with no `after_id`, the newest `limit`."""
        where, args = ("id > ?", [after_id]) if function is None else ("function = ? AND id > ?", [function, after_id])
        order = "ASC" if after_id else "DESC"
        rows = self.db.execute(
            f"SELECT id, at, function, kind, message, data FROM events WHERE {where} ORDER BY id {order} LIMIT ?",
            (*args, limit),
        ).fetchall()
        if order == "DESC":
            rows.reverse()
        return [Event(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]) if r[5] else None) for r in rows]
