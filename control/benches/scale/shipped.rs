//! `--measure N --binary PATH`: the fleet dials `PATH server` instead of
//! this program's own control plane, so that a build of the binary (with
//! or without a profile, `scripts/release-pgo`) is measured under the
//! same agents: a control plane on SQLite, its agent listener's cap
//! raised for the fleet, logging warnings only, as an operator of a fleet
//! this size would run it. Its CPU and memory are read from `/proc/PID`.

use llmgw_testkit::Served;

/// A running `llmgw server` that leads its control plane, stopped
/// (SIGTERM) when dropped.
pub(crate) struct Shipped {
    served: Served,
    /// Where agents dial, host:port.
    pub(crate) agent: String,
}

impl Shipped {
    /// `binary server` with a control plane, once it holds the lease, its
    /// agent listener capped just above `agents` (the binary refuses caps
    /// that its open-file limit cannot honour, and the client listener's
    /// default cap is lowered for the same reason).
    pub(crate) fn start(binary: &str, agents: usize) -> Shipped {
        let config = format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\n\
             agent_listen: \"127.0.0.1:0\"\n\
             control:\n  enabled: true\n  instance: bench\n\
             connections:\n  max:\n    agent: {}\n    client: 1024\n",
            agents + 100
        );
        // Agents are refused until it leads: its log says when.
        let served = Served::start(
            binary,
            &config,
            Some("warn,llmgw_control::leadership=info"),
            &["agent listening on "],
            Some("leading (epoch"),
        );
        Shipped {
            agent: served.addr(0).to_owned(),
            served,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.served.pid()
    }
}
