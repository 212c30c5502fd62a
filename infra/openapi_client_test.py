"""A client generated from the served OpenAPI document works.

Generates a Python client with openapi-python-client (pinned in
infra/requirements-openapi-client.txt, run from this interpreter's venv)
from $AGENT_RUNS_URL/v1/openapi.json, failing on any generator warning;
imports every module of it; then, only through the generated functions,
creates a `script` run, waits for its approval, approves it, and waits for
it to succeed with the expected output. With OPENAPI_TS_CHECK=1 and npx on
PATH it also runs openapi-typescript (pinned) on the document and
type-checks a use of the types with tsc (pinned), a decision with edited
arguments included.

Env: AGENT_RUNS_URL (e.g. http://127.0.0.1:8080), AGENT_RUNS_KEY (a key
with runs:write, runs:read and approvals:decide). Called by
infra/api-conformance.sh with the server it started.
"""

import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

OPENAPI_TYPESCRIPT = "openapi-typescript@7.13.0"
TYPESCRIPT = "typescript@5.9.3"
PACKAGE = "agent_runs_client"
INPUT = "say checking\napprove Delete 3 stale branches\nsay done"
OUTPUT = "checking\napproved: Delete 3 stale branches\ndone"
WAIT_SECS = 30


class Failure(Exception):
    pass


def generate(document: Path, work: Path) -> Path:
    """The generated project's directory (holding the package)."""
    bin_dir = Path(sys.executable).parent
    generator = bin_dir / "openapi-python-client"
    if not generator.exists():
        raise Failure(f"{generator} is missing: install infra/requirements-openapi-client.txt in this venv")
    config = work / "config.json"
    config.write_text(json.dumps({"package_name_override": PACKAGE, "project_name_override": "agent-runs-client"}))
    out = work / "client"
    # The generator's post hooks run ruff (pinned with it) from PATH.
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [
            str(generator),
            "generate",
            "--path",
            str(document),
            "--output-path",
            str(out),
            "--config",
            str(config),
            "--fail-on-warning",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
    )
    if result.returncode != 0 or not (out / PACKAGE / "client.py").exists():
        raise Failure(f"openapi-python-client failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return out


def import_all(project: Path):
    """Imports every module of the generated package; returns the package."""
    sys.path.insert(0, str(project))
    package = importlib.import_module(PACKAGE)
    failed = []
    for module in pkgutil.walk_packages(package.__path__, f"{PACKAGE}."):
        try:
            importlib.import_module(module.name)
        except Exception as error:  # noqa: BLE001 - reported with the module's name
            failed.append(f"{module.name}: {type(error).__name__}: {error}")
    if failed:
        raise Failure("the generated client does not import:\n  " + "\n  ".join(failed))
    return package


def parsed(response, status: int, kind, what: str):
    """The response's parsed body, which must be `kind` with `status`."""
    if int(response.status_code) != status or not isinstance(response.parsed, kind):
        body = response.content.decode("utf-8", "replace")
        raise Failure(f"{what}: expected {status} with a {kind.__name__}, got {int(response.status_code)}: {body}")
    return response.parsed


def wait_for(get_run, client, run_id: str, status: str):
    from agent_runs_client.models import Run

    deadline = time.monotonic() + WAIT_SECS
    while True:
        run = parsed(get_run.sync_detailed(run_id=run_id, client=client), 200, Run, f"getRun {run_id}")
        if run.status == status:
            return run
        if run.status in ("succeeded", "failed", "canceled"):
            raise Failure(f"run {run_id} ended {run.status} (error {run.error!r}) while waiting for {status}")
        if time.monotonic() > deadline:
            raise Failure(f"run {run_id} still {run.status} after {WAIT_SECS} s, waiting for {status}")
        time.sleep(0.1)


def drive(base_url: str, key: str) -> None:
    """create -> awaiting_approval -> approve -> succeeded, through the generated client."""
    from agent_runs_client import AuthenticatedClient
    from agent_runs_client.api.default import create_run, decide_approval, get_run
    from agent_runs_client.models import ApprovalStatus, CreateRun, Decision, DecisionDecision, Run, RunStatus

    # The generator names a property that shadows a builtin with a trailing
    # underscore: `input` is `input_`.

    with AuthenticatedClient(base_url=base_url, token=key, timeout=30.0) as client:
        created = parsed(
            create_run.sync_detailed(client=client, body=CreateRun(input_=INPUT, agent="script")), 201, Run, "createRun"
        )
        if created.agent != "script" or created.input_ != INPUT:
            raise Failure(f"createRun answered another run: {created.to_dict()}")
        waiting = wait_for(get_run, client, created.id, RunStatus.AWAITING_APPROVAL)
        pending = [a for a in waiting.pending_approvals if a.status == ApprovalStatus.PENDING]
        if len(pending) != 1 or pending[0].action != "Delete 3 stale branches":
            raise Failure(
                f"expected one pending approval for the action, got {[a.to_dict() for a in waiting.pending_approvals]}"
            )
        approval = pending[0]
        decided = parsed(
            decide_approval.sync_detailed(
                run_id=created.id,
                approval_id=approval.id,
                client=client,
                body=Decision(decision=DecisionDecision.APPROVE, comment="via the generated client"),
            ),
            200,
            Run,
            "decideApproval",
        )
        if decided.id != created.id:
            raise Failure(f"decideApproval answered another run: {decided.id}")
        done = wait_for(get_run, client, created.id, RunStatus.SUCCEEDED)
        if done.output != OUTPUT:
            raise Failure(f"run {created.id} succeeded with output {done.output!r}, expected {OUTPUT!r}")
        statuses = [a.status for a in done.pending_approvals]
        if statuses != [ApprovalStatus.APPROVED]:
            raise Failure(f"the approval's status is {statuses}, expected approved")


TS_USE = """\
import type { components, paths } from "./schema";
type Decision = components["schemas"]["Decision"];
export const approve: Decision = { decision: "approve", comment: "ok" };
export const edit: Decision = { decision: "edit", arguments: { path: "/tmp/x", count: 3, nested: { a: [1] } } };
export function proposed(run: components["schemas"]["Run"]): unknown {
  return run.pending_approvals[0]?.arguments?.["path"];
}
export type DecideBody = NonNullable<
  paths["/v1/agent/runs/{run_id}/approvals/{approval_id}"]["post"]["requestBody"]
>["content"]["application/json"];
export const body: DecideBody = edit;
"""


def typescript(document: Path, work: Path) -> None:
    npx = shutil.which("npx")
    if npx is None:
        print("openapi-typescript: skipped (no npx)")
        return
    ts = work / "ts"
    ts.mkdir()
    steps = [
        [npx, "--yes", OPENAPI_TYPESCRIPT, str(document), "-o", str(ts / "schema.ts")],
        [npx, "--yes", "-p", TYPESCRIPT, "tsc", "--noEmit", "--strict", "--target", "es2020", "use.ts"],
    ]
    (ts / "use.ts").write_text(TS_USE)
    for step in steps:
        result = subprocess.run(step, check=False, capture_output=True, text=True, cwd=ts, timeout=600)
        if result.returncode != 0:
            raise Failure(f"{' '.join(step[1:4])} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    print(f"openapi-typescript: types generated ({OPENAPI_TYPESCRIPT}) and a use of them type-checks ({TYPESCRIPT})")


def main() -> int:
    base_url = os.environ.get("AGENT_RUNS_URL", "").rstrip("/")
    key = os.environ.get("AGENT_RUNS_KEY", "")
    if not base_url or not key:
        print("openapi client: AGENT_RUNS_URL and AGENT_RUNS_KEY must be set", file=sys.stderr)
        return 2
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="openapi-client-") as tmp:
        work = Path(tmp)
        checks = []
        document = work / "openapi.json"

        def fetch():
            with urllib.request.urlopen(f"{base_url}/v1/openapi.json", timeout=30) as response:
                document.write_bytes(response.read())
            json.loads(document.read_text())

        def python_client():
            project = generate(document, work)
            import_all(project)
            drive(base_url, key)
            print("openapi-python-client: generated, imported, and drove create -> approve -> succeeded")

        checks.append(("python client: create -> approve -> succeeded", python_client))
        if os.environ.get("OPENAPI_TS_CHECK") == "1":
            checks.append(("openapi-typescript", lambda: typescript(document, work)))
        try:
            fetch()
        except Exception as error:  # noqa: BLE001
            print(f"openapi client: cannot fetch {base_url}/v1/openapi.json: {error}", file=sys.stderr)
            return 1
        for name, check in checks:
            try:
                check()
                passed += 1
            except Failure as error:
                failed += 1
                print(f"FAILED {name}: {error}", file=sys.stderr)
            except Exception as error:  # noqa: BLE001 - any other error fails the check, with its name
                failed += 1
                print(f"FAILED {name}: {type(error).__name__}: {error}", file=sys.stderr)
    print(f"openapi client: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
