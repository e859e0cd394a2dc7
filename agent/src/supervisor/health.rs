//! Whether an engine serves: `/health` answers 200 (a loading engine
//! answers 503) and `/v1/models` lists the shard's model by its exact id
//! (an engine answering for another model is not this shard's).

use std::time::Duration;

use serde::Deserialize;

/// Why a probe did not pass; the last one goes into a startup timeout's
/// error, so the operator sees how far the engine got.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("health: {0}")]
    Health(String),
    #[error("models: {0}")]
    Models(String),
    #[error("engine is up but does not serve {0:?} yet")]
    NotServing(String),
}

/// Probes one engine's HTTP surface.
#[derive(Debug, Clone)]
pub struct Health {
    client: reqwest::Client,
    base: String,
    model: Option<String>,
}

#[derive(Deserialize)]
struct Models {
    data: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    id: String,
}

impl Health {
    /// `model` None (or empty) skips the model check. A timeout of zero
    /// takes the default of 3 s.
    pub fn new(host: &str, port: u16, model: Option<String>, timeout: Duration) -> Health {
        let timeout = if timeout.is_zero() {
            Duration::from_secs(3)
        } else {
            timeout
        };
        Health {
            // An agent behind an HTTP proxy must still reach its own
            // engines directly.
            client: reqwest::Client::builder()
                .timeout(timeout)
                .no_proxy()
                .build()
                .unwrap_or_default(),
            base: format!("http://{}", crate::engines::host_port(host, port)),
            model: model.filter(|m| !m.is_empty()),
        }
    }

    pub async fn ready(&self) -> Result<(), NotReady> {
        self.get("/health").await.map_err(NotReady::Health)?;
        let Some(model) = &self.model else {
            return Ok(());
        };
        let body = self.get("/v1/models").await.map_err(NotReady::Models)?;
        let listed: Models =
            serde_json::from_slice(&body).map_err(|e| NotReady::Models(e.to_string()))?;
        if listed.data.iter().any(|e| &e.id == model) {
            Ok(())
        } else {
            Err(NotReady::NotServing(model.clone()))
        }
    }

    async fn get(&self, path: &str) -> Result<Vec<u8>, String> {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(format!("status {}", resp.status()));
        }
        resp.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| e.to_string())
    }
}
