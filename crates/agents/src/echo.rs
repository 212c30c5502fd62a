use async_trait::async_trait;

use super::{Agent, Step, StepInput};

/// Succeeds with its input as the output.
pub struct EchoAgent;

#[async_trait]
impl Agent for EchoAgent {
    fn validate_input(&self, _input: &str) -> Result<(), String> {
        Ok(())
    }

    fn description(&self) -> Option<&'static str> {
        Some("Succeeds with its input as the output.")
    }

    async fn step(&self, input: StepInput<'_>) -> Step {
        Step::succeeded(input.input)
    }

    fn ends_at_once(&self) -> bool {
        true
    }
}
