//! Approval receipts, judged by the ecosystem's own libraries: a call a
//! person approved (edited) reaches its tool with `Agent-Runs-Approval`,
//! which PyJWT and npm's `jose` verify against the embedded server's JWKS,
//! and refuse when tampered with, meant for another tool, or expired.

mod support;

use std::process::Command;

use serde_json::{Value, json};
use support::{Server, Target};

/// The issuer the embedded server is configured with; the Lambda path
/// takes its default, the gateway's URL.
const ISSUER: &str = "https://runs.example.test";

/// What a receipt checker printed.
fn checked(program: &str, args: &[&str]) -> Value {
    let output = Command::new(program).args(args).output().unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(output.status.success(), "{program}: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn embedded_an_approved_call_carries_a_receipt_that_pyjwt_and_jose_verify() {
    an_approved_call_carries_a_receipt_that_pyjwt_and_jose_verify(Target::Embedded);
}

/// Signed by a KMS key (the emulator's), published by the sweeper before
/// any receipt, served by the `$default` route.
#[test]
fn lambda_an_approved_call_carries_a_receipt_that_pyjwt_and_jose_verify() {
    if support::without_emulator("lambda_an_approved_call_carries_a_receipt_that_pyjwt_and_jose_verify") {
        return;
    }
    an_approved_call_carries_a_receipt_that_pyjwt_and_jose_verify(Target::Lambda);
}

fn an_approved_call_carries_a_receipt_that_pyjwt_and_jose_verify(target: Target) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(agent_runs_testkit::stand_in::StandIn::start());
    model.script(vec![
        agent_runs_testkit::stand_in::tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#),
        agent_runs_testkit::stand_in::text("Deleted older."),
    ]);
    let server = match target {
        Target::Embedded => {
            Server::start_on(target, &[("AGENT_RUNS_AGENT_CACHE_SECS", "0"), ("AGENT_RUNS_ISSUER", ISSUER)])
        }
        Target::Lambda => Server::start_on(target, &[("AGENT_RUNS_AGENT_CACHE_SECS", "0")]),
    };
    let issuer = if target == Target::Embedded { ISSUER.to_owned() } else { server.base.clone() };
    let key = server.dev_key.clone().unwrap();
    // The keys, to anyone (no Authorization), before any receipt: on AWS
    // the sweeper publishes the key at its first pass.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let jwks = loop {
        let jwks = server.send(server.request("GET", "/.well-known/jwks.json"));
        assert_eq!(jwks.status, 200);
        if jwks.body["keys"].as_array().is_some_and(|keys| !keys.is_empty()) || std::time::Instant::now() > deadline {
            break jwks;
        }
        assert_eq!(jwks.headers["cache-control"], "no-store", "an empty set is not cached");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(jwks.body["keys"].as_array().map(Vec::len), Some(1), "{}", jwks.body);
    assert_eq!(jwks.headers["cache-control"], "public, max-age=300");
    let unknown = server.send(server.request("GET", "/.well-known/jwks.json?kid=x"));
    assert_eq!((unknown.status, &unknown.body["error"]["param"]), (400, &json!("kid")), "{}", unknown.body);
    // Both keyless documents are read with HEAD too, as the console is.
    for path in ["/.well-known/jwks.json", "/v1/openapi.json"] {
        let head = server.request("HEAD", path).send().unwrap();
        assert_eq!(head.status(), 200, "HEAD {path}");
        assert_eq!(head.headers()["content-type"], "application/json", "HEAD {path}");
        assert!(head.text().unwrap().is_empty(), "HEAD {path} has no body");
        let post = server.send(server.request("POST", path));
        assert_eq!((post.status, post.header("allow")), (405, Some("GET, HEAD")), "POST {path}");
    }

    let file = server.dir.path().join("janitor.toml");
    std::fs::write(&file, support::janitor_definition(&model.url, "")).unwrap();
    server.admin(&["agents", "put", "--file", file.to_str().unwrap()]);
    let run = server.create(&key, json!({"agent": "janitor", "input": "Delete old"}));
    let id = run["id"].as_str().unwrap();
    let waiting = server.wait_for_status(&key, id, "awaiting_approval");
    let approval = &waiting["pending_approvals"][0];
    let path = format!("/v1/agent/runs/{id}/approvals/{}", approval["id"].as_str().unwrap());
    server.post(&key, &path, json!({"decision": "edit", "arguments": {"branch": "older"}})).expect_status(200);
    server.wait_for_status(&key, id, "succeeded");

    let calls = model.tool_calls();
    assert_eq!(calls.len(), 1);
    let after = server.send(server.request("GET", "/.well-known/jwks.json"));
    assert_eq!(after.body, jwks.body, "the key that signed is the one published before");
    let jwk = &jwks.body["keys"][0];
    assert_eq!(
        (jwk["kty"].as_str(), jwk["crv"].as_str(), jwk["use"].as_str()),
        (Some("EC"), Some("P-256"), Some("sig"))
    );
    assert!(jwk.get("d").is_none(), "never the private part");

    let receipt = calls[0].receipt.clone().expect("the call carries its receipt");
    let jwks_url = format!("{}/.well-known/jwks.json", server.base);
    let audience = format!("{}/tools/delete", model.url);
    let digest = hex_sha256(&calls[0].body);
    let python = std::env::var("AGENT_RUNS_TEST_PYTHON")
        .expect("AGENT_RUNS_TEST_PYTHON names a Python with pyjwt[crypto] (bash infra/test.sh sets it up)");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/receipt_check.py");
    let by_python = checked(&python, &[script, &jwks_url, &receipt, &audience, &issuer]);
    let node_dir = std::env::var("AGENT_RUNS_TEST_NODE_DIR")
        .expect("AGENT_RUNS_TEST_NODE_DIR names a folder with npm's jose installed (bash infra/test.sh sets it up)");
    // Run from beside its node_modules, where `jose` resolves.
    let node_script = std::path::Path::new(&node_dir).join("receipt_check.mjs");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/receipt_check.mjs"), &node_script).unwrap();
    let by_node = checked("node", &[node_script.to_str().unwrap(), &jwks_url, &receipt, &audience, &issuer]);

    for (checker, result, refusals) in [
        ("PyJWT", &by_python, ["InvalidSignatureError", "InvalidAudienceError", "ExpiredSignatureError"]),
        (
            "jose",
            &by_node,
            ["ERR_JWS_SIGNATURE_VERIFICATION_FAILED", "ERR_JWT_CLAIM_VALIDATION_FAILED", "ERR_JWT_EXPIRED"],
        ),
    ] {
        let claims = &result["claims"];
        assert_eq!(claims["iss"], issuer.as_str(), "{checker}: {claims}");
        assert_eq!(claims["aud"], audience.as_str(), "{checker}: the tool's URL as written");
        assert_eq!(claims["sub"], approval["id"], "{checker}");
        assert_eq!(claims["jti"], approval["id"], "{checker}");
        assert_eq!(claims["run_id"], id, "{checker}");
        assert_eq!(claims["tool"], "delete_branch", "{checker}");
        assert_eq!(claims["decision"], "edit", "{checker}");
        assert_eq!(claims["decided_by"].as_str().map(|by| by.starts_with("key_")), Some(true), "{checker}");
        assert_eq!(claims["arguments_sha256"], digest.as_str(), "{checker}: the digest of the body sent");
        assert_eq!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(), 300, "{checker}");
        let got = [&result["tampered"], &result["wrong_audience"], &result["expired"]];
        assert_eq!(got, refusals.map(Value::from).each_ref(), "{checker}: {result}");
    }
    assert_eq!(calls[0].body, r#"{"branch":"older"}"#);
}

fn hex_sha256(text: &str) -> String {
    agent_runs_domain::sha256_hex(text.as_bytes())
}
