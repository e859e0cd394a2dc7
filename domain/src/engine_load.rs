//! What an engine's Prometheus page says about its queue, in the names each
//! engine publishes. The gateway reads it to route by load; the control
//! plane reads it to stop a drained replica as soon as nothing runs on it.
//! Pure: the caller fetches the page.

use crate::catalog::Engine;

/// The names an engine publishes running, waiting and KV usage under.
/// Running and waiting are required of every engine; llama.cpp publishes
/// no KV usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vocabulary {
    pub running: &'static str,
    pub waiting: &'static str,
    pub kv_usage: Option<&'static str>,
}

impl Engine {
    pub fn vocabulary(self) -> Vocabulary {
        match self {
            Engine::Vllm => Vocabulary {
                running: "vllm:num_requests_running",
                waiting: "vllm:num_requests_waiting",
                kv_usage: Some("vllm:kv_cache_usage_perc"),
            },
            Engine::Sglang => Vocabulary {
                running: "sglang:num_running_reqs",
                waiting: "sglang:num_queue_reqs",
                kv_usage: Some("sglang:token_usage"),
            },
            Engine::Llamacpp => Vocabulary {
                running: "llamacpp:requests_processing",
                waiting: "llamacpp:requests_deferred",
                kv_usage: None,
            },
            Engine::Sim => Vocabulary {
                running: "llmgw_sim_running",
                waiting: "llmgw_sim_waiting",
                kv_usage: Some("llmgw_sim_kv_cache_usage"),
            },
        }
    }
}

/// Sums every series of `name` in a Prometheus text page, or None when the
/// page has no such series.
pub fn value(page: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in page.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
        *found.get_or_insert(0.0) += v;
    }
    found
}

/// Running plus waiting requests, or why the page cannot say.
pub fn queued(page: &str, vocabulary: Vocabulary) -> Result<f64, String> {
    let need = |n: &str| value(page, n).ok_or_else(|| format!("the page has no {n}"));
    Ok(need(vocabulary.running)? + need(vocabulary.waiting)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_running_and_waiting_summed_over_series() {
        let page = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"a\"} 2\nvllm:num_requests_running{model_name=\"b\"} 1\nvllm:num_requests_waiting{model_name=\"a\"} 4\n";
        assert_eq!(queued(page, Engine::Vllm.vocabulary()), Ok(7.0));
        let err = queued(page, Engine::Sglang.vocabulary()).unwrap_err();
        assert!(err.contains("sglang:num_running_reqs"), "{err}");
        // A longer name with the same prefix is not the metric.
        assert_eq!(
            value(
                "vllm:num_requests_running_total 9\n",
                "vllm:num_requests_running"
            ),
            None
        );
    }
}
