//! Open files for the listeners' connection caps.
//!
//! Every connection a listener takes is a file descriptor, and so is the
//! engine connection each proxied request holds. Linux starts most
//! processes with a soft limit of 1,024 open files (kept low for
//! select(2), which llmgw does not use) under a far higher hard one; under
//! it the default caps (8,192 clients, 4,096 agents) could never be
//! reached: past ~1,000 connections every accept failed with EMFILE. So the
//! server raises its soft limit to the hard one at start, as Go's runtime
//! does for every Go program. Caps that still do not fit are refused at
//! start when the operator set them, and lowered to fit, with a warning,
//! when they are the defaults.

use llmgw_gateway::ConnectionLimits;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Files kept for all that is not a listener's connection: the store's
/// connections, the log, engines' probes and scrapes, handshakes in
/// progress.
pub(crate) const RESERVE: u64 = 256;

/// The open-file limit before and after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    pub(crate) was: u64,
    pub(crate) now: u64,
}

/// Raises this process's soft limit on open files to its hard limit.
pub(crate) fn raise() -> Limit {
    let l = getrlimit(Resource::Nofile);
    // None is "unlimited"; the kernel bounds open files anyway.
    let was = l.current.unwrap_or(u64::MAX);
    let hard = l.maximum.unwrap_or(u64::MAX);
    if was >= hard {
        return Limit { was, now: was };
    }
    let raised = Rlimit {
        current: l.maximum,
        maximum: l.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => Limit { was, now: hard },
        // A hard limit the kernel will not give (above fs.nr_open).
        Err(_) => Limit { was, now: was },
    }
}

/// Which listeners this server opens besides the client and admin ones.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opened {
    pub(crate) metrics: bool,
    pub(crate) agents: bool,
}

/// How the caps met the limit.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// As they were.
    AsSet,
    /// Default caps lowered: each one's key, from, to.
    Lowered(Vec<(&'static str, usize, usize)>),
}

/// Files the caps may take at once: each opened listener's cap, the
/// client's once more (each of its requests may hold an engine
/// connection), and the [`RESERVE`].
pub(crate) fn needed(l: &ConnectionLimits, opened: Opened) -> u64 {
    let n = |v: usize| v as u64;
    RESERVE
        + 2 * n(l.max_client)
        + n(l.max_admin)
        + if opened.metrics { n(l.max_metrics) } else { 0 }
        + if opened.agents { n(l.max_agent) } else { 0 }
}

/// Fits the caps into `files` open files. `set` names the caps the
/// operator set (`connections.max.client`, ...); only the others, the
/// client's and the agents', are lowered, in proportion. The error says
/// what does not fit and what to do.
pub(crate) fn fit(
    l: &mut ConnectionLimits,
    opened: Opened,
    set: &[&str],
    files: u64,
) -> Result<Fit, String> {
    let need = needed(l, opened);
    if need <= files {
        return Ok(Fit::AsSet);
    }
    // (key, weight in files a connection, the cap)
    let mut flexible: Vec<(&'static str, u64, &mut usize)> = Vec::new();
    if !set.contains(&"connections.max.client") {
        flexible.push(("connections.max.client", 2, &mut l.max_client));
    }
    if opened.agents && !set.contains(&"connections.max.agent") {
        flexible.push(("connections.max.agent", 1, &mut l.max_agent));
    }
    let lowerable: u64 = flexible.iter().map(|(_, w, c)| w * **c as u64).sum();
    let fixed = need - lowerable;
    let least: u64 = flexible.iter().map(|(_, w, _)| w).sum();
    let room = files.saturating_sub(fixed);
    if flexible.is_empty() || room < least.max(1) {
        let which = if set.is_empty() {
            "connections.max.*".to_owned()
        } else {
            set.join(", ")
        };
        return Err(format!(
            "the connection caps need up to {need} open files (each listener's cap, the client's twice for its engine connections, and {RESERVE} more), but this process may open {files}: raise its limit (LimitNOFILE= in a systemd unit, `ulimit -n`, docker's --ulimit nofile=) or lower {which}"
        ));
    }
    let share = room as f64 / lowerable as f64;
    let mut lowered = Vec::new();
    for (key, _, cap) in flexible {
        let from = *cap;
        *cap = ((from as f64 * share) as usize).max(1);
        lowered.push((key, from, *cap));
    }
    Ok(Fit::Lowered(lowered))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTER: Opened = Opened {
        metrics: false,
        agents: false,
    };
    const CONTROL: Opened = Opened {
        metrics: true,
        agents: true,
    };

    #[test]
    fn the_defaults_need_the_client_twice_and_every_opened_listener() {
        let d = ConnectionLimits::default();
        assert_eq!(needed(&d, ROUTER), 256 + 2 * 8192 + 256);
        assert_eq!(needed(&d, CONTROL), 256 + 2 * 8192 + 256 + 64 + 4096);
    }

    #[test]
    fn caps_that_fit_stay_as_set() {
        let mut l = ConnectionLimits::default();
        let files = needed(&l, CONTROL);
        assert_eq!(fit(&mut l, CONTROL, &[], files), Ok(Fit::AsSet));
        assert_eq!(l, ConnectionLimits::default());
    }

    #[test]
    fn default_caps_are_lowered_in_proportion_to_fit() {
        let mut l = ConnectionLimits::default();
        let got = fit(&mut l, CONTROL, &[], 1024).unwrap();
        // 1024 - 256 - 256 - 64 = 448 files for 2 x 8192 + 4096.
        assert_eq!(
            got,
            Fit::Lowered(vec![
                ("connections.max.client", 8192, 179),
                ("connections.max.agent", 4096, 89),
            ])
        );
        assert!(needed(&l, CONTROL) <= 1024);
        assert_eq!((l.max_admin, l.max_metrics), (256, 64));
    }

    #[test]
    fn only_the_caps_not_set_are_lowered() {
        let mut l = ConnectionLimits {
            max_agent: 10_000,
            ..ConnectionLimits::default()
        };
        let got = fit(&mut l, CONTROL, &["connections.max.agent"], 20_000).unwrap();
        let Fit::Lowered(v) = got else {
            panic!("{got:?}")
        };
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0, "connections.max.client");
        assert_eq!(l.max_agent, 10_000);
        assert!(needed(&l, CONTROL) <= 20_000);
    }

    #[test]
    fn caps_the_operator_set_that_cannot_fit_are_refused() {
        let mut l = ConnectionLimits {
            max_client: 4096,
            ..ConnectionLimits::default()
        };
        let err = fit(&mut l, ROUTER, &["connections.max.client"], 2048).unwrap_err();
        assert!(err.contains("need up to 8704 open files"), "{err}");
        assert!(err.contains("may open 2048"), "{err}");
        assert!(err.contains("lower connections.max.client"), "{err}");
        assert_eq!(l.max_client, 4096, "left as set");
    }

    #[test]
    fn a_limit_below_the_reserve_is_refused_even_with_defaults() {
        let mut l = ConnectionLimits::default();
        let err = fit(&mut l, ROUTER, &[], 300).unwrap_err();
        assert!(err.contains("lower connections.max.*"), "{err}");
    }
}
