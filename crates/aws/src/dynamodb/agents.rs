//! Defined agents in the table: `AGENT#<name>` / `AGENT`, the definition
//! as JSON text.

use async_trait::async_trait;

use super::items::{text, unavailable};
use super::{DynamoStore, Item, n, s};
use agent_runs_domain::{AgentDefinition, Timestamp};
use agent_runs_ports::store::{AgentStore, StoreError, encode_agent};

fn agent_pk(name: &str) -> String {
    format!("AGENT#{name}")
}

fn decode_agent(item: &Item) -> Result<AgentDefinition, StoreError> {
    agent_runs_ports::store::decode_agent(text(item, "definition")?)
}

#[async_trait]
impl AgentStore for DynamoStore {
    async fn put_agent(&self, agent: &AgentDefinition, at: Timestamp) -> Result<(), StoreError> {
        let definition = encode_agent(agent)?;
        self.client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(agent_pk(&agent.name)))
            .item("sk", s("AGENT"))
            .item("definition", s(definition))
            .item("updated_at", n(at.millis()))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn get_agent(&self, name: &str) -> Result<Option<AgentDefinition>, StoreError> {
        self.get_item(agent_pk(name), "AGENT".into()).await?.as_ref().map(decode_agent).transpose()
    }

    async fn list_agents(&self) -> Result<Vec<AgentDefinition>, StoreError> {
        let mut agents = Vec::new();
        for item in self.scan_kind("AGENT").await? {
            agents.push(decode_agent(&item)?);
        }
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(agents)
    }

    async fn delete_agent(&self, name: &str) -> Result<bool, StoreError> {
        let output = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(agent_pk(name)))
            .key("sk", s("AGENT"))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllOld)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(output.attributes.is_some_and(|old| !old.is_empty()))
    }
}
