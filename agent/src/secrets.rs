//! The agent's own secrets in its environment (a join token, from the
//! unit's environment file) stay with the agent: what it runs (engines,
//! which run model code; probes; installers) has no use for them.

/// The variables that carry them (the current name and the older one).
pub const AGENT_SECRETS: [&str; 2] = ["LLMGW_AGENT_JOIN", "LLMGW_JOIN_TOKEN"];

/// A command that inherits the agent's environment, but not its secrets.
pub(crate) trait WithoutSecrets {
    fn envs_without_secrets(&mut self) -> &mut Self;
}

impl WithoutSecrets for std::process::Command {
    fn envs_without_secrets(&mut self) -> &mut Self {
        AGENT_SECRETS.iter().fold(self, |c, k| c.env_remove(k))
    }
}

impl WithoutSecrets for tokio::process::Command {
    fn envs_without_secrets(&mut self) -> &mut Self {
        AGENT_SECRETS.iter().fold(self, |c, k| c.env_remove(k))
    }
}
