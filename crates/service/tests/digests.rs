//! Approval digests are computable by others: for a corpus of the cases a
//! plain `sort_keys` serializer gets wrong, the service's
//! `arguments_sha256` equals SHA-256 of what an independent RFC 8785
//! implementation writes (PyPI `rfc8785`, in the test venv that
//! `bash infra/test.sh` makes).

use std::io::Write;
use std::process::{Command, Stdio};

use agent_runs_domain::{Approval, ProposedCall, canonical_json};
use agent_runs_testkit::approvals::pending_approval;
use serde_json::Value;

/// Each a JSON object of arguments, as a model or a person might send it.
const CORPUS: &[&str] = &[
    r#"{"zero": -0, "negative_zero": -0.0, "small": 1e-7, "big": 1e21, "bigger": 1e+22, "half": 1.5}"#,
    r#"{"exact": 9007199254740991, "negative": -9007199254740991, "tiny": 5e-324, "third": 333333333.33333329}"#,
    r#"{"float_integers": [1.0, 100.0, 1E2, 2e0], "fractions": [0.1, 0.000001, 1e-6, 123456789.123]}"#,
    r#"{"separators": "\u2028 and \u2029", "emoji": "\ud83d\ude00 \u2764\ufe0f", "accents": "\u00e9t\u00e9"}"#,
    r#"{"controls": "\u0000\u0001\b\t\n\f\r\u001f\u007f", "quotes": "\"\\/"}"#,
    r#"{"\ue000": 1, "\ud83d\ude00": 2, "a": {"z": 1, "Z": 2, "\u00e9": 3, "e": [{"b": null, "a": true}]}}"#,
    r#"{"10": "ten", "9": "nine", "": "empty", "A": false, "nested": {"deeper": {"deepest": []}}}"#,
];

fn service_digest(arguments: Value) -> String {
    let approval = Approval {
        action: "Call the tool".into(),
        call: Some(ProposedCall { tool: "tool".into(), arguments }),
        ..pending_approval()
    };
    approval.arguments_sha256().unwrap()
}

#[test]
fn the_service_s_digests_equal_an_independent_rfc_8785_implementation_s() {
    let Some(python) = std::env::var_os("AGENT_RUNS_TEST_PYTHON") else {
        eprintln!(
            "skipped the_service_s_digests_equal_an_independent_rfc_8785_implementation_s: it needs a Python with rfc8785; `bash infra/test.sh` makes one"
        );
        return;
    };
    // One document per line in, "<canonical text as JSON string>\t<sha256>" per line out.
    let script = r#"
import hashlib, json, sys, rfc8785
for line in sys.stdin:
    canonical = rfc8785.dumps(json.loads(line))
    print(json.dumps(canonical.decode("utf-8")) + "\t" + hashlib.sha256(canonical).hexdigest())
"#;
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start python");
    let input: String = CORPUS.iter().map(|json| format!("{json}\n")).collect();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "rfc8785 failed");
    let lines: Vec<String> = String::from_utf8(output.stdout).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), CORPUS.len());
    for (json, line) in CORPUS.iter().zip(lines) {
        let (text, digest) = line.split_once('\t').unwrap();
        let theirs: String = serde_json::from_str(text).unwrap();
        let arguments: Value = serde_json::from_str(json).unwrap();
        assert_eq!(canonical_json(&arguments), theirs, "{json}");
        assert_eq!(service_digest(arguments), digest, "{json}");
    }
}
