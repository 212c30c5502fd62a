//! `agent-runs agents put|list|get|delete`: the operator's agent definitions.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use agent_runs_agents::llm::{DEFAULT_MAX_CHECKPOINT_BYTES, EnvLookup, LlmRuntime, offered, pin};
use agent_runs_agents::public_network;
use agent_runs_domain::{AgentDefinition, Clock, SystemClock, compile_listed_schema};
use clap::Subcommand;

use crate::keys::{Error, admin_store};

#[derive(Subcommand)]
pub enum AgentsCommand {
    /// Create or replace an agent from a TOML file (docs/guide/defined-agents.md).
    Put {
        /// The definition (TOML, as examples/janitor.toml).
        #[arg(long)]
        file: PathBuf,
    },
    /// List the defined agents.
    List,
    /// Print an agent's definition as JSON.
    Get {
        /// The agent's name.
        name: String,
    },
    /// Delete an agent; runs that name it fail when a worker next picks them up.
    Delete {
        /// The agent's name.
        name: String,
    },
}

pub fn read_definition(file: &Path) -> Result<AgentDefinition, Error> {
    let text = std::fs::read_to_string(file).map_err(|error| format!("cannot read {}: {error}", file.display()))?;
    let definition: AgentDefinition = toml::from_str(&text)
        .map_err(|error| format!("{} is not a valid agent definition: {error}", file.display()))?;
    let definition = definition.parse().map_err(|error| format!("{}: {error}", file.display()))?;
    // A tool whose URL names this machine or a private address could never
    // be called without the opt-in: say so now rather than at each call.
    if !definition.allow_private_network {
        for tool in &definition.tools {
            if public_network::check_url(&tool.url).is_err() {
                return Err(format!(
                    "{}: tool `{}`: its URL names a local or private address, which tool calls may not reach; \
                     if the tool runs on a private network, set `allow_private_network = true` (docs/guide/defined-agents.md).",
                    file.display(),
                    tool.name
                )
                .into());
            }
        }
        for server in &definition.mcp_servers {
            if public_network::check_url(&server.url).is_err() {
                return Err(format!(
                    "{}: mcp_servers `{}`: its URL names a local or private address, which tools may not reach; \
                     if the server runs on a private network, set `allow_private_network = true`.",
                    file.display(),
                    server.name
                )
                .into());
            }
        }
    }
    Ok(definition)
}

/// Connects to each MCP server of the definition, lists its tools and
/// keeps the pin of each (`agents put` again re-pins). The headers'
/// environment variables must be set where this runs too.
pub async fn pin_mcp_servers(definition: &mut AgentDefinition) -> Result<(), Error> {
    if definition.mcp_servers.is_empty() {
        return Ok(());
    }
    let runtime = LlmRuntime::from_process_env(DEFAULT_MAX_CHECKPOINT_BYTES);
    let http = runtime.tool_http(definition.allow_private_network);
    let env: EnvLookup = Arc::new(|name| std::env::var(name).ok());
    for server in &mut definition.mcp_servers {
        if let Some(variable) = server.headers_from_env.values().find(|variable| std::env::var(variable).is_err()) {
            return Err(format!(
                "MCP server `{}`: set {variable} in this shell too: `agents put` connects to the server to pin its tools.",
                server.name
            )
            .into());
        }
        let listed = pin(server, &http, &env).await.map_err(|why| why.0)?;
        // What a run offers, judged as a run judges it.
        let tools = offered(server, listed.clone());
        let names: Vec<String> = tools
            .iter()
            .map(|tool| {
                let gated = if tool.definition.requires_approval { " (approval)" } else { "" };
                format!("{}{gated}", tool.definition.name)
            })
            .collect();
        eprintln!(
            "Pinned {} tools of MCP server `{}`; the model is offered {}: {}.",
            listed.len(),
            server.name,
            names.len(),
            names.join(", ")
        );
        let is_offered = |name: &str| tools.iter().any(|tool| tool.mcp.as_ref().is_some_and(|mcp| mcp.tool == name));
        for left_out in listed.iter().filter(|tool| server.offers(&tool.name) && !is_offered(&tool.name)) {
            let why = match compile_listed_schema(&left_out.input_schema) {
                Err(problem) => format!("its input schema cannot be used: {problem}"),
                Ok(_) => "its full name is not one models accept".to_owned(),
            };
            eprintln!("MCP server `{}`: the tool `{}` is not offered: {why}.", server.name, left_out.name);
        }
        if let Some(tools) = &server.tools {
            for missing in tools.iter().filter(|name| !listed.iter().any(|tool| &tool.name == *name)) {
                eprintln!("MCP server `{}` lists no tool `{missing}` (in its `tools`).", server.name);
            }
        }
    }
    Ok(())
}

pub async fn run(command: AgentsCommand, db: &Path) -> Result<(), Error> {
    // Read the file (and pin its MCP servers) before touching the store, so
    // a mistake changes nothing.
    let definition = match &command {
        AgentsCommand::Put { file } => {
            let mut definition = read_definition(file)?;
            pin_mcp_servers(&mut definition).await?;
            Some(definition)
        }
        _ => None,
    };
    let store = admin_store(db).await?;
    match command {
        AgentsCommand::Put { .. } => {
            let definition = definition.expect("read above");
            store.put_agent(&definition, SystemClock.now()).await?;
            eprintln!(
                "Saved agent `{}` ({} tools, {} MCP servers).",
                definition.name,
                definition.tools.len(),
                definition.mcp_servers.len()
            );
            if definition.allow_private_network {
                eprintln!("Its tools may reach private and local network addresses (allow_private_network).");
            }
        }
        AgentsCommand::List => {
            println!("{:<24}  {:<8}  {:<40}  TOOLS", "NAME", "PROVIDER", "MODEL");
            for agent in store.list_agents().await? {
                let provider = serde_json::to_value(agent.provider)?;
                let http = agent.tools.iter().map(|tool| {
                    if tool.requires_approval { format!("{} (approval)", tool.name) } else { tool.name.clone() }
                });
                let mcp = agent
                    .mcp_servers
                    .iter()
                    .map(|server| format!("{} (MCP, {} pinned)", server.tool_name("*"), server.pinned.len()));
                let tools: Vec<String> = http.chain(mcp).collect();
                println!(
                    "{:<24}  {:<8}  {:<40}  {}",
                    agent.name,
                    provider.as_str().unwrap_or_default(),
                    agent.model,
                    tools.join(", ")
                );
            }
        }
        AgentsCommand::Get { name } => {
            let agent = store.get_agent(&name).await?.ok_or_else(|| format!("no agent named `{name}`"))?;
            println!("{}", serde_json::to_string_pretty(&agent)?);
        }
        AgentsCommand::Delete { name } => {
            if !store.delete_agent(&name).await? {
                return Err(format!("no agent named `{name}`").into());
            }
            eprintln!("Deleted agent `{name}`.");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_definition_reads() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut read = 0;
        for entry in std::fs::read_dir(examples).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|extension| extension == "toml") {
                read_definition(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
                read += 1;
            }
        }
        assert!(read >= 2, "janitor.toml and triage.toml");
    }
}
