//! Where a tool may be: public addresses only without the opt-in, no redirects.

use super::*;

pub(super) const NOT_PUBLIC: &str =
    "The tool's address is not allowed: it resolves to a private or local network address. The call was not made.";

/// What the model was told about its first tool call (the last message of
/// the second model request).
pub(super) fn first_tool_result(fixture: &Fixture) -> String {
    let sent = messages(fixture, 1);
    let result = sent.last().unwrap();
    assert_eq!(result["role"], "tool", "{result}");
    result["content"].as_str().unwrap().to_owned()
}

/// Runs one `lookup` call of an agent whose `lookup` tool is at `url`,
/// without the private network opt-in, and returns what the model was told.
pub(super) async fn lookup_without_the_opt_in(url: impl FnOnce(&StandIn) -> String) -> (Fixture, String) {
    let stand_in = StandIn::start().await;
    let url = url(&stand_in);
    let fixture = Fixture::with(
        |document| {
            document.as_object_mut().unwrap().remove("allow_private_network");
            document["tools"][0]["url"] = json!(url);
        },
        256 * 1024,
    )
    .await;
    fixture.stand_in.script(vec![tool_call("call_1", "lookup", r#"{"id":"OPS-7"}"#), text("Could not look it up.")]);
    let message = fixture.create("Is OPS-7 open?").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("Could not look it up."));
    let told = first_tool_result(&fixture);
    // The tool server that was named got nothing.
    assert!(stand_in.tool_calls().is_empty(), "{:?}", stand_in.tool_calls());
    (fixture, told)
}

#[tokio::test]
pub(super) async fn without_the_opt_in_a_tool_on_a_loopback_address_is_refused_and_never_called() {
    let (fixture, told) = lookup_without_the_opt_in(|tools| format!("{}/tools/lookup", tools.url)).await;
    assert_eq!(told, NOT_PUBLIC);
    assert!(fixture.stand_in.tool_calls().is_empty());
    // Nothing about the address itself reaches the model.
    let port = fixture.stand_in.url.rsplit(':').next().unwrap().to_owned();
    assert!(!told.contains("127.0.0.1") && !told.contains(&port), "{told}");
}

#[tokio::test]
pub(super) async fn without_the_opt_in_metadata_localhost_and_mapped_loopback_addresses_are_refused() {
    let port = |tools: &StandIn| tools.url.rsplit(':').next().unwrap().to_owned();
    let (_, told) =
        lookup_without_the_opt_in(|_| "http://169.254.169.254/latest/meta-data/iam/security-credentials/".into()).await;
    assert_eq!(told, NOT_PUBLIC, "the metadata endpoint");
    let (_, told) = lookup_without_the_opt_in(|tools| format!("http://localhost:{}/tools/lookup", port(tools))).await;
    assert_eq!(told, NOT_PUBLIC, "localhost");
    let (_, told) =
        lookup_without_the_opt_in(|tools| format!("http://[::ffff:127.0.0.1]:{}/tools/lookup", port(tools))).await;
    assert_eq!(told, NOT_PUBLIC, "IPv4-mapped loopback");
    let (_, told) = lookup_without_the_opt_in(|tools| format!("http://127.1:{}/tools/lookup", port(tools))).await;
    assert_eq!(told, NOT_PUBLIC, "a short form of 127.0.0.1");
}

/// The resolver itself, without the check of the URL in front of it: a name
/// that resolves only to this machine gets no connection.
#[tokio::test]
pub(super) async fn the_tools_client_refuses_a_name_that_resolves_to_a_loopback_address() {
    use agent_runs_agents::public_network::NotPublic;
    let stand_in = StandIn::start().await;
    let port = stand_in.url.rsplit(':').next().unwrap().to_owned();
    let runtime = LlmRuntime::new(Arc::new(|_| None), 256 * 1024);
    let http = runtime.tool_http(false);
    assert!(http.public_only);
    let error = http.client.get(format!("http://localhost:{port}/tools/lookup")).send().await.unwrap_err();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    let mut refused = false;
    while let Some(cause) = source {
        refused |= cause.downcast_ref::<NotPublic>().is_some();
        source = cause.source();
    }
    assert!(refused, "{}", agent_runs_ports::error_chain(&error));
    assert!(stand_in.tool_calls().is_empty());
    // The client for definitions that opt in connects.
    let allowed = runtime.tool_http(true);
    assert!(!allowed.public_only);
    let response = allowed.client.get(format!("http://localhost:{port}/tools/lookup")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(stand_in.tool_calls().len(), 1);
}

#[tokio::test]
pub(super) async fn a_redirect_is_not_followed_and_the_secret_header_goes_nowhere_else() {
    // The opt-in is on (both servers are local): redirects are refused anyway.
    let elsewhere = StandIn::start().await;
    let fixture = Fixture::with(
        |document| document["tools"][0]["headers_from_env"] = json!({"Authorization": "DELETE_TOKEN"}),
        256 * 1024,
    )
    .await;
    fixture.stand_in.redirect_tools_to(&format!("{}/tools/lookup", elsewhere.url));
    fixture.stand_in.script(vec![tool_call("call_1", "lookup", r#"{"id":"OPS-7"}"#), text("It moved.")]);
    let message = fixture.create("Is OPS-7 open?").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);

    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].authorization.as_deref(), Some("Bearer tool-token"));
    assert!(elsewhere.tool_calls().is_empty(), "the redirect was followed: {:?}", elsewhere.tool_calls());
    let told = first_tool_result(&fixture);
    assert!(told.starts_with("The tool answered HTTP 302") && told.contains("redirect"), "{told}");
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("It moved."));
}

#[tokio::test]
pub(super) async fn with_the_opt_in_a_tool_on_a_loopback_address_is_called() {
    let fixture = Fixture::new().await;
    assert!(fixture.stand_in.url.starts_with("http://127.0.0.1:"));
    fixture.stand_in.script(vec![tool_call("call_1", "lookup", r#"{"id":"OPS-7"}"#), text("Open.")]);
    let message = fixture.create("Is OPS-7 open?").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 1);
    let told: Value = serde_json::from_str(&first_tool_result(&fixture)).unwrap();
    assert_eq!(told["ok"], true);
}
