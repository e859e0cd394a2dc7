//! Old event shapes made current on read. Stored rows are never rewritten:
//! an auditor sees what was written, a projection sees today's shape.

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

use crate::{RecordedEvent, StoreError, TextPage};

/// Turns one event type's payload from schema version `n` into `n + 1`.
pub type UpcastFn = fn(Value) -> Result<Value, String>;

/// The current schema version of each event type and the steps that lead
/// there. An event type that is not registered is passed through unchanged.
#[derive(Default, Clone)]
pub struct Upcasters {
    current: HashMap<String, u32>,
    steps: HashMap<(String, u32), UpcastFn>,
}

impl fmt::Debug for Upcasters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upcasters")
            .field("current", &self.current)
            .field("steps", &self.steps.len())
            .finish()
    }
}

impl Upcasters {
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares that `event_type` is currently at schema version `version`.
    pub fn current(mut self, event_type: &str, version: u32) -> Self {
        self.current.insert(event_type.to_owned(), version);
        self
    }

    /// Registers the step from `from` to `from + 1`.
    pub fn step(mut self, event_type: &str, from: u32, f: UpcastFn) -> Self {
        self.steps.insert((event_type.to_owned(), from), f);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    /// Brings `event` to its type's current version, one step at a time.
    pub fn upcast(&self, mut event: RecordedEvent) -> Result<RecordedEvent, StoreError> {
        let Some(&target) = self.current.get(&event.event_type) else {
            return Ok(event);
        };
        if event.schema_version < target {
            event.payload = self.steps_to(
                &event.event_type,
                event.schema_version,
                target,
                std::mem::take(&mut event.payload),
            )?;
            event.schema_version = target;
        }
        Ok(event)
    }

    /// The same for a page read as text: a payload is parsed (and its new
    /// shape written into the page) only when a step applies.
    pub fn upcast_page(&self, page: &mut TextPage) -> Result<(), StoreError> {
        if self.is_empty() {
            return Ok(());
        }
        for i in 0..page.len() {
            let Some(e) = page.get(i) else { break };
            let Some(&target) = self.current.get(e.event_type) else {
                continue;
            };
            if e.schema_version >= target {
                continue;
            }
            let payload: Value =
                serde_json::from_str(e.payload).map_err(|err| StoreError::Corrupt {
                    position: e.position,
                    reason: err.to_string(),
                })?;
            let payload = self
                .steps_to(e.event_type, e.schema_version, target, payload)?
                .to_string();
            page.set_payload(i, target, &payload);
        }
        Ok(())
    }

    fn steps_to(
        &self,
        event_type: &str,
        mut from: u32,
        target: u32,
        mut payload: Value,
    ) -> Result<Value, StoreError> {
        while from < target {
            let step = self
                .steps
                .get(&(event_type.to_owned(), from))
                .ok_or_else(|| StoreError::MissingUpcaster {
                    event_type: event_type.to_owned(),
                    from,
                    to: target,
                })?;
            payload = step(payload).map_err(|reason| StoreError::Upcast {
                event_type: event_type.to_owned(),
                from,
                reason,
            })?;
            from += 1;
        }
        Ok(payload)
    }

    pub fn upcast_all(&self, events: Vec<RecordedEvent>) -> Result<Vec<RecordedEvent>, StoreError> {
        if self.is_empty() {
            return Ok(events);
        }
        events.into_iter().map(|e| self.upcast(e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use serde_json::json;

    fn event(version: u32, payload: Value) -> RecordedEvent {
        RecordedEvent {
            position: 1,
            stream_id: "node-a".into(),
            stream_version: 1,
            event_id: uuid::Uuid::nil(),
            event_type: "NodeRegistered".into(),
            schema_version: version,
            payload,
            metadata: json!({}),
            epoch: 1,
            recorded_at: Utc::now(),
            hash: [0; 32],
        }
    }

    fn v1_to_v2(mut v: Value) -> Result<Value, String> {
        let name = v["hostname"].take();
        Ok(json!({ "name": name, "labels": {} }))
    }

    fn v2_to_v3(mut v: Value) -> Result<Value, String> {
        v["gpus"] = json!([]);
        Ok(v)
    }

    #[test]
    fn steps_chain_to_the_current_version() {
        let reg = Upcasters::new()
            .current("NodeRegistered", 3)
            .step("NodeRegistered", 1, v1_to_v2)
            .step("NodeRegistered", 2, v2_to_v3);
        let up = reg.upcast(event(1, json!({"hostname": "gpu-a"}))).unwrap();
        assert_eq!(up.schema_version, 3);
        assert_eq!(
            up.payload,
            json!({"name": "gpu-a", "labels": {}, "gpus": []})
        );
        // Already current: untouched.
        let cur = reg.upcast(event(3, json!({"x": 1}))).unwrap();
        assert_eq!(cur.payload, json!({"x": 1}));
    }

    #[test]
    fn a_missing_step_is_an_error_not_a_silent_pass() {
        let reg = Upcasters::new()
            .current("NodeRegistered", 3)
            .step("NodeRegistered", 2, v2_to_v3);
        let err = reg.upcast(event(1, json!({}))).unwrap_err();
        assert!(
            matches!(err, StoreError::MissingUpcaster { from: 1, to: 3, .. }),
            "{err}"
        );
    }
}
