//! `agent-runs`: the embedded server and the admin commands.

mod agents;
mod aws_setup;
mod client;
mod gateway;
mod http_server;
mod keys;
mod policies;
mod serve;
mod template;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

// The embedded server allocates a few dozen times per request on two
// threads and the store's writer: glibc's malloc took an eighth of a
// create's time (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "agent-runs", version, about = "The Agent Runs service: embedded server and admin tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The SQLite database of the commands that work on one (offered by those
/// alone).
#[derive(clap::Args)]
struct Database {
    /// The SQLite database file (created with its folder if missing).
    #[arg(long, global = true, env = "AGENT_RUNS_DB", default_value = ".agent-runs/runs.db")]
    db: PathBuf,
}

#[derive(clap::Args)]
struct ServeCommand {
    #[command(flatten)]
    database: Database,
    #[command(flatten)]
    args: serve::ServeArgs,
}

#[derive(clap::Args)]
struct KeysArgs {
    #[command(flatten)]
    database: Database,
    #[command(subcommand)]
    command: keys::KeysCommand,
}

#[derive(clap::Args)]
struct AgentsArgs {
    #[command(flatten)]
    database: Database,
    #[command(subcommand)]
    command: agents::AgentsCommand,
}

#[derive(clap::Args)]
struct RunsArgs {
    #[command(flatten)]
    connection: client::Connection,
    #[command(subcommand)]
    command: client::RunsCommand,
}

#[derive(clap::Args)]
struct ApprovalsArgs {
    #[command(flatten)]
    connection: client::Connection,
    #[command(subcommand)]
    command: client::ApprovalsCommand,
}

#[derive(clap::Args)]
struct PoliciesArgs {
    #[command(flatten)]
    connection: client::Connection,
    #[command(subcommand)]
    command: policies::PoliciesCommand,
}

#[derive(clap::Args)]
struct TemplateArgs {
    /// Rewrite the generated part of this template in place, and the
    /// `cargo lambda watch` router of the Cargo.toml beside it.
    #[arg(long, value_name = "TEMPLATE")]
    write: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve every operation on one port, with workers in the same process.
    Serve(ServeCommand),
    /// Issue, list and revoke API keys (in DynamoDB when AGENT_RUNS_TABLE is set).
    Keys(KeysArgs),
    /// Define, list, show and delete LLM agents (in DynamoDB when AGENT_RUNS_TABLE is set).
    Agents(AgentsArgs),
    /// Create the DynamoDB table and SQS queues as template.yaml defines them.
    AwsSetup(aws_setup::AwsSetupArgs),
    /// Move a table written before the sharded layout (2026-11-23) to it.
    AwsMigrate(aws_setup::AwsMigrateArgs),
    /// Run the Lambda handlers locally as API Gateway, SQS and the schedule would.
    Gateway(gateway::GatewayArgs),
    /// Print the OpenAPI document for the built-in agents (docs/openapi.json).
    Openapi,
    /// Print the Lambda functions of template.yaml, or rewrite them there.
    Template(TemplateArgs),
    /// Create, list, follow and decide runs through the HTTP API (AGENT_RUNS_URL, AGENT_RUNS_KEY).
    Runs(RunsArgs),
    /// The approvals inbox, through the HTTP API.
    Approvals(ApprovalsArgs),
    /// The owner's approval policy: show, replace, try rules on past decisions.
    Policies(PoliciesArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let result = match cli.command {
            Command::Serve(serve) => serve::run(serve.args, &serve.database.db).await,
            Command::Keys(keys) => keys::run(keys.command, &keys.database.db).await,
            Command::Agents(agents) => agents::run(agents.command, &agents.database.db).await,
            Command::AwsSetup(args) => aws_setup::run(args).await,
            Command::AwsMigrate(args) => aws_setup::migrate(args).await,
            Command::Openapi => print_openapi(),
            Command::Template(args) => template(args),
            Command::Gateway(args) => {
                serve::init_logging();
                gateway::run(args, serve::shutdown_signal()).await
            }
            // The API client: exit 0 only when the command did what was
            // asked and, for `watch`, the run succeeded.
            Command::Runs(args) => return exit(client::runs(args.command, &args.connection).await),
            Command::Approvals(args) => return exit(client::approvals(args.command, &args.connection).await),
            Command::Policies(args) => return exit(policies::run(args.command, &args.connection).await),
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

fn print_openapi() -> Result<(), Box<dyn std::error::Error>> {
    let agents = agent_runs_agents::AgentRegistry::builtin("echo")?;
    let document = agent_runs_service::api::openapi::document(&agents.names_list(), agents.default_name());
    println!("{}", serde_json::to_string_pretty(&document)?);
    Ok(())
}

fn template(args: TemplateArgs) -> Result<(), Box<dyn std::error::Error>> {
    let Some(path) = args.write else {
        print!("{}", template::functions_yaml());
        return Ok(());
    };
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))
    };
    let text = read(&path)?;
    let functions = template::regenerate(&text)
        .ok_or_else(|| format!("{} has no generated part (a line `{}`)", path.display(), template::BEGIN.trim()))?;
    let manifest = path.with_file_name("Cargo.toml");
    let text = read(&manifest)?;
    let router = template::regenerate_router(&text)
        .ok_or_else(|| format!("{} has no `{}`", manifest.display(), template::ROUTER.trim()))?;
    // Both made before either is written: a failure changes neither.
    std::fs::write(&path, functions)?;
    std::fs::write(&manifest, router)?;
    Ok(())
}

/// The client's exit code: 0 done, 1 done and the run did not succeed
/// (`watch`), 2 the command itself failed.
fn exit(result: Result<client::Done, client::Error>) -> ExitCode {
    match result {
        Ok(client::Done::Ok) => ExitCode::SUCCESS,
        Ok(client::Done::Unsuccessful) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}
