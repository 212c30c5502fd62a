//! `agent-runs agents put|list|get|delete`: the operator's agent definitions.

use std::path::{Path, PathBuf};

use agent_runs_shared::domain::{AgentDefinition, Clock, SystemClock};
use agent_runs_shared::public_network;
use clap::Subcommand;

use crate::keys::{Error, admin_store};

#[derive(Subcommand)]
pub enum AgentsCommand {
    /// Create or replace an agent from a TOML file (see README: "Defined agents").
    Put {
        #[arg(long)]
        file: PathBuf,
    },
    /// List the defined agents.
    List,
    /// Print an agent's definition as JSON.
    Get { name: String },
    /// Delete an agent; runs that name it fail when a worker next picks them up.
    Delete { name: String },
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
                     if the tool runs on a private network, set `allow_private_network = true` (README, \"Defined agents\").",
                    file.display(),
                    tool.name
                )
                .into());
            }
        }
    }
    Ok(definition)
}

pub async fn run(command: AgentsCommand, db: &Path) -> Result<(), Error> {
    // Read the file before touching the store, so a mistake changes nothing.
    let definition = match &command {
        AgentsCommand::Put { file } => Some(read_definition(file)?),
        _ => None,
    };
    let store = admin_store(db).await?;
    match command {
        AgentsCommand::Put { .. } => {
            let definition = definition.expect("read above");
            store.put_agent(&definition, SystemClock.now()).await?;
            eprintln!("Saved agent `{}` ({} tools).", definition.name, definition.tools.len());
            if definition.allow_private_network {
                eprintln!("Its tools may reach private and local network addresses (allow_private_network).");
            }
        }
        AgentsCommand::List => {
            println!("{:<24}  {:<8}  {:<40}  TOOLS", "NAME", "PROVIDER", "MODEL");
            for agent in store.list_agents().await? {
                let provider = serde_json::to_value(agent.provider)?;
                let tools: Vec<String> =
                    agent
                        .tools
                        .iter()
                        .map(|tool| {
                            if tool.requires_approval { format!("{} (approval)", tool.name) } else { tool.name.clone() }
                        })
                        .collect();
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
