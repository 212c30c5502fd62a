//! `agent-runs keys create|list|revoke`.

use std::path::Path;

use agent_runs_aws::DynamoStore;
use agent_runs_domain::{Clock, IdGenerator, KeyId, Owner, Scope, Scopes, SystemClock};
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_platform::aws_sdk::sdk_config;
use agent_runs_ports::store::{AgentStore, KeyStore};
use agent_runs_service::auth::generate_key;
use agent_runs_service::config::Config;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Issue a key for an owner; the key is printed once and never stored.
    Create {
        /// The owner (tenant) whose runs the key sees and changes.
        #[arg(long)]
        owner: String,
        /// A label to recognise the key by.
        #[arg(long)]
        name: Option<String>,
        /// What the key may do (repeatable): runs:read, runs:write,
        /// approvals:decide, webhooks:manage, policies:manage. Without it, everything.
        /// runs:write and approvals:decide include runs:read.
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
    },
    /// List every key with its owner and status (never the key itself).
    List,
    /// Revoke a key; it stops working within 60 seconds everywhere.
    Revoke {
        /// The key's id (key_..., as `keys list` shows it).
        key_id: String,
    },
}

pub type Error = Box<dyn std::error::Error>;

/// Issues a key with every scope and stores its hash; returns the key and its id.
pub async fn issue(keys: &dyn KeyStore, owner: Owner, name: Option<String>) -> Result<(String, KeyId), Error> {
    issue_with(keys, owner, name, Scopes::all()).await
}

async fn issue_with(
    keys: &dyn KeyStore,
    owner: Owner,
    name: Option<String>,
    scopes: Scopes,
) -> Result<(String, KeyId), Error> {
    let now = SystemClock.now();
    let id = KeyId::from_ulid(IdGenerator::default().ulid_at(now));
    let mut issued = generate_key(id, owner, name, now);
    issued.stored.scopes = scopes;
    keys.put_key(&issued.stored).await?;
    Ok((issued.secret, id))
}

/// What the admin commands manage: keys and agent definitions.
pub trait AdminStore: KeyStore + AgentStore {}
impl<T: KeyStore + AgentStore> AdminStore for T {}

/// The store in use: DynamoDB when `AGENT_RUNS_TABLE` is set, else the
/// SQLite database.
pub async fn admin_store(db: &Path) -> Result<Box<dyn AdminStore>, Error> {
    let config = Config::from_env()?;
    match config.table {
        Some(table) => {
            let client = aws_sdk_dynamodb::Client::new(&sdk_config().await);
            Ok(Box::new(DynamoStore::new(client, table)))
        }
        None => Ok(Box::new(SqliteStore::open(db, Durability::default())?)),
    }
}

pub async fn run(command: KeysCommand, db: &Path) -> Result<(), Error> {
    let store = admin_store(db).await?;
    let store = store.as_ref();
    match command {
        KeysCommand::Create { owner, name, scopes } => {
            let owner = Owner::parse(&owner)?;
            let scopes = if scopes.is_empty() {
                Scopes::all()
            } else {
                Scopes::parse(scopes.iter().map(String::as_str)).map_err(|unknown| {
                    let known: Vec<&str> = Scope::ALL.iter().map(|scope| scope.as_str()).collect();
                    format!("unknown scope `{unknown}`; the scopes are {}", known.join(", "))
                })?
            };
            let (secret, id) = issue_with(store, owner.clone(), name, scopes).await?;
            eprintln!("Issued {id} for owner {owner}. It is shown only this once:");
            println!("{secret}");
        }
        KeysCommand::List => {
            let header = ["ID", "OWNER", "CREATED", "STATUS", "SCOPES", "NAME"].map(String::from).to_vec();
            let mut rows = vec![header];
            for key in store.list_keys().await? {
                let status = if key.revoked_at.is_some() { "revoked" } else { "active" };
                rows.push(vec![
                    key.id.to_string(),
                    key.owner.to_string(),
                    key.created_at.to_rfc3339(),
                    status.into(),
                    key.scopes.names().join(","),
                    key.name.unwrap_or_default(),
                ]);
            }
            print!("{}", crate::client::table(&rows));
        }
        KeysCommand::Revoke { key_id } => {
            let id: KeyId = key_id.parse().map_err(|_| format!("`{key_id}` is not a key id (key_...)"))?;
            if !store.revoke_key(id, SystemClock.now()).await? {
                return Err(format!("no key {id}").into());
            }
            eprintln!("Revoked {id}. Servers stop accepting it within 60 seconds.");
        }
    }
    Ok(())
}
