//! The highest lease epoch this agent has seen, and the fence it makes.
//!
//! Every message from the control plane carries its sender's lease epoch.
//! A higher epoch than any seen means a newer leader; a lower one means the
//! sender was deposed, whatever it believes (its database link cut, its
//! process paused past its lease), so the agent carries out nothing it
//! says. The number is kept in the work dir, so a restarted agent does not
//! forget it and obey a deposed leader that still holds the door open.

use std::path::{Path, PathBuf};

use llmgw_api::v1::control_message::Msg;

/// The file in the work dir.
const FILE: &str = "lease-epoch";

/// Whether to carry out a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Obey,
    /// From an epoch lower than the highest seen: its sender is deposed.
    Refuse {
        highest: u64,
    },
}

#[derive(Debug)]
pub(super) struct Epochs {
    highest: u64,
    path: Option<PathBuf>,
}

impl Epochs {
    /// What the work dir remembers (0 without one, or when the file is
    /// absent or unreadable: an agent that cannot read its fence is
    /// warned about, not stranded).
    pub(super) fn load(work_dir: Option<&Path>) -> Epochs {
        let path = work_dir.map(|d| d.join(FILE));
        let highest = match path.as_deref().map(std::fs::read_to_string) {
            None => 0,
            Some(Ok(text)) => text.trim().parse().unwrap_or_else(|e| {
                tracing::warn!(file = %FILE, error = %e, "the remembered lease epoch is unreadable; starting from 0");
                0
            }),
            Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Some(Err(e)) => {
                tracing::warn!(file = %FILE, error = %e, "cannot read the remembered lease epoch; starting from 0");
                0
            }
        };
        Epochs { highest, path }
    }

    pub(super) fn highest(&self) -> u64 {
        self.highest
    }

    /// A message's epoch against the highest seen. 0 is a server too old
    /// to stamp its messages: obeyed, as before epochs existed.
    pub(super) fn judge(&self, epoch: u64) -> Verdict {
        if epoch != 0 && epoch < self.highest {
            Verdict::Refuse {
                highest: self.highest,
            }
        } else {
            Verdict::Obey
        }
    }

    /// An epoch seen (on a message obeyed, or in a standby's refusal):
    /// kept, and written down before the message is carried out, when it
    /// is the highest yet.
    pub(super) fn saw(&mut self, epoch: u64) {
        if epoch > self.highest {
            self.set(epoch);
        }
    }

    /// The leader renewed its lease after reading this agent's epoch and
    /// its store's epoch is still lower: the store went back to an older
    /// copy (or this agent saw another store). Its epoch is taken as the
    /// highest, or the agent would refuse this cluster for ever.
    pub(super) fn lowered(&mut self, epoch: u64) {
        if epoch != 0 && epoch < self.highest {
            tracing::warn!(
                was = self.highest,
                now = epoch,
                "the leader's store is at a lower lease epoch than this agent saw (restored from an older copy, or another store): following it"
            );
            self.set(epoch);
        }
    }

    fn set(&mut self, epoch: u64) {
        self.highest = epoch;
        if let Some(path) = &self.path
            && let Err(e) = write(path, epoch)
        {
            tracing::warn!(file = %path.display(), error = %e, "cannot write down the lease epoch; a restart would forget it");
        }
    }
}

/// Written whole or not at all: a crash mid-write leaves the old number.
fn write(path: &Path, epoch: u64) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{epoch}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A message's name in a refusal and the logs, and the shard it names.
pub(super) fn describe(msg: Option<&Msg>) -> (&'static str, String) {
    match msg {
        Some(Msg::Start(s)) => ("start", s.shard_id.clone()),
        Some(Msg::Stop(s)) => ("stop", s.shard_id.clone()),
        Some(Msg::Drain(d)) => ("drain", d.shard_id.clone()),
        Some(Msg::RemoveWeights(_)) => ("remove_weights", String::new()),
        Some(Msg::Provision(_)) => ("provision", String::new()),
        Some(Msg::Logs(_)) => ("logs", String::new()),
        Some(Msg::Ack(_)) => ("ack", String::new()),
        None => ("empty", String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_epoch_is_refused_and_the_highest_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = Epochs::load(Some(dir.path()));
        assert_eq!(e.judge(3), Verdict::Obey);
        e.saw(3);
        e.saw(2);
        assert_eq!(e.highest(), 3);
        assert_eq!(e.judge(2), Verdict::Refuse { highest: 3 });
        assert_eq!(e.judge(3), Verdict::Obey);
        assert_eq!(e.judge(4), Verdict::Obey);
        // Unstamped (an older server): obeyed.
        assert_eq!(e.judge(0), Verdict::Obey);
        let again = Epochs::load(Some(dir.path()));
        assert_eq!(again.highest(), 3, "a restart remembers");
        assert_eq!(again.judge(2), Verdict::Refuse { highest: 3 });
    }

    #[test]
    fn a_restored_store_lowers_the_epoch_only_when_the_leader_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = Epochs::load(Some(dir.path()));
        e.saw(9);
        e.lowered(4);
        assert_eq!(e.highest(), 4);
        assert_eq!(Epochs::load(Some(dir.path())).highest(), 4);
        e.lowered(0);
        assert_eq!(e.highest(), 4, "0 says nothing");
    }

    #[test]
    fn an_unreadable_file_starts_from_zero() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "not a number").unwrap();
        assert_eq!(Epochs::load(Some(dir.path())).highest(), 0);
        assert_eq!(Epochs::load(None).highest(), 0);
    }
}
