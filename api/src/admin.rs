//! The admin API's JSON (`/api/v1/…` on the admin listener), shared by the
//! server that writes it and the CLI that reads it.

use serde::{Deserialize, Serialize};

/// Every error body: one sentence that says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRow {
    pub id: String,
    pub hostname: String,
    pub addr: String,
    /// ready | unreachable | lost
    pub state: String,
    pub cordoned: bool,
    pub draining: bool,
    pub gpus: usize,
    pub gpus_free: usize,
    /// Distinct GPU classes, comma-separated; empty for a CPU node.
    pub classes: String,
    pub fabrics: Vec<String>,
    pub memory_total_mb: u64,
    pub engines: Vec<String>,
    pub replicas: usize,
    /// Whether this server holds the node's stream (only the leader does).
    pub connected: bool,
    /// Seconds since the last heartbeat this server saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_s: Option<f64>,
    /// The node's cards by class: how many and how much memory each.
    #[serde(default)]
    pub gpu_classes: Vec<GpuClassRow>,
    /// The engines the node was asked to install (`engines:`), as it last
    /// reported them; only the leader knows (empty on a standby).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub provision: Vec<ProvisionRow>,
    /// Why cards are kept out of placement: "GPU 1: 3 uncorrected ECC
    /// errors", one a problem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_problems: Vec<String>,
}

/// One engine a node was asked to install.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisionRow {
    pub engine: String,
    pub version: String,
    /// `cpu`, `cuda-12.8`.
    pub variant: String,
    /// installing | ready | failed | unsupported
    pub state: String,
    /// Progress, the reason for a failure, or the version the binary
    /// printed.
    pub detail: String,
}

/// Cards of one class on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuClassRow {
    pub class: String,
    pub count: u32,
    /// The smallest card's, as its driver reports it.
    pub memory_mb: u64,
}

/// A catalog profile's shape: what `ctl plan` compares its split with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileShape {
    pub name: String,
    pub engine: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_class: Option<String>,
    pub tp: u32,
    pub pp: u32,
    pub nodes: u32,
    pub gpus_per_node: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRow {
    pub name: String,
    pub aliases: Vec<String>,
    pub profiles: Vec<String>,
    pub min: u32,
    pub max: u32,
    pub on_demand: bool,
    pub replicas: usize,
    pub ready: usize,
    /// Why its newest replica failed, while none is ready: a failed
    /// replica is stopped at once, so this is where the reason stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    /// Why it has fewer replicas than its `scaling.min`, when the reason
    /// is that it fits nowhere now: placement's one-line summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplaced: Option<String>,
    /// Where its weights come from (a path, a hub id, a URL).
    #[serde(default)]
    pub source: String,
    /// Its profiles' shapes, in catalog order.
    #[serde(default)]
    pub shapes: Vec<ProfileShape>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardRow {
    pub shard_id: String,
    pub rank: u32,
    pub node: String,
    pub gpus: Vec<u32>,
    pub port: u16,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The weights download it waits on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch: Option<Fetch>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetch {
    pub bytes_done: u64,
    /// 0 when the size is unknown.
    pub bytes_total: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaRow {
    pub id: String,
    pub model: String,
    pub profile: String,
    pub status: String,
    pub adopted: bool,
    /// The profile was edited since it was placed; it is being replaced.
    pub outdated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
    pub shards: Vec<ShardRow>,
    /// Why it failed or stopped, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

/// One node's verdict for one profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub node: String,
    pub fits: bool,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileVerdict {
    pub profile: String,
    pub priority: i32,
    pub outcome: String,
    pub candidates: Vec<Candidate>,
}

/// `explain-placement`: what a placement now would do, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub model: String,
    pub summary: String,
    pub profiles: Vec<ProfileVerdict>,
}

/// An engine build every node is asked to install (server.yaml `engines:`),
/// as the agents are told it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineRow {
    pub engine: String,
    pub version: String,
    /// Where its archives come from (a URL template once resolved).
    pub source: String,
    /// The fleet mirror's manifest of the version when the archives come
    /// from the mirror (`<mirror>/<model>/<version>`), else empty: what
    /// `llmgw mirror unused` must count as in use.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub manifest: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Leader {
    /// This server's instance name.
    pub instance: String,
    pub is_leader: bool,
    /// The current or last holder of the append lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    pub epoch: u64,
    pub held: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub leader: Leader,
    pub models: usize,
    pub models_ready: usize,
    /// Models whose ready replicas are all on nodes gone quiet: not
    /// counted in `models_ready`, yet routed while their engines answer.
    #[serde(default)]
    pub models_unreachable: usize,
    pub nodes: usize,
    pub nodes_ready: usize,
    /// Live replicas (placed, not stopped).
    pub replicas: usize,
    /// Ready, on nodes that answer: what serves.
    pub replicas_ready: usize,
    /// Ready when last heard of, on a node that has gone quiet (not yet
    /// lost): not counted as serving.
    #[serde(default)]
    pub replicas_unreachable: usize,
    /// Replicas the catalog wants now (its minimums, and on-demand
    /// models asked for lately): more than `replicas` means some wait for
    /// a place.
    #[serde(default)]
    pub replicas_wanted: usize,
    /// Replicas wanted that have no place yet, model by model (one
    /// model's extra replica, replacing another, does not hide another
    /// model's missing one). None from a server that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas_waiting: Option<usize>,
    /// Replicas wanted of models the reconciler holds back after their
    /// failures, until their backoff ends (not waiting for a place).
    #[serde(default)]
    pub replicas_backing_off: usize,
    /// Nodes that take no new work: cordoned (and not draining), and
    /// draining (their work moving off).
    #[serde(default)]
    pub nodes_cordoned: usize,
    #[serde(default)]
    pub nodes_draining: usize,
    /// Events in the log (None when the store cannot be read: a lag
    /// worked out from it would read 0), and how far this server's views
    /// have read.
    #[serde(default)]
    pub log_head: Option<u64>,
    pub views_at: u64,
    /// Why the store could not be read for this answer: the figures are
    /// this server's views as they stand, and the lease as this server
    /// last knew it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_error: Option<String>,
}

/// `ctl logs`: the tail of one of a node's logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Logs {
    pub node: String,
    pub source: String,
    pub lines: Vec<String>,
    /// Every log the node can show.
    pub sources: Vec<String>,
}

/// The answer to a change: what was appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changed {
    /// Event types appended, in order; empty when nothing needed to change.
    pub events: Vec<String>,
    pub message: String,
}

/// Who issued an operator command (an OS user or `--as NAME`), recorded
/// with the events it causes; the admin listener is on loopback, so this
/// is an audit label, not a credential.
pub const ACTOR_HEADER: &str = "x-llmgw-actor";
/// Who the [`ACTOR_HEADER`] names: absent (or `operator`) for an operator
/// at the CLI or a script, `person` for a signed-in person acting on the
/// pages (the client listener's own calls), so that an auditor can tell
/// the two apart. Any other value is refused.
pub const ACTOR_KIND_HEADER: &str = "x-llmgw-actor-kind";
/// The [`ACTOR_KIND_HEADER`] of a signed-in person.
pub const ACTOR_KIND_PERSON: &str = "person";
/// The command's id, recorded with its events: a retried command keeps it.
pub const COMMAND_HEADER: &str = "x-llmgw-command-id";
/// The longest command id kept; a longer (or empty) one is replaced.
pub const COMMAND_ID_MAX: usize = 128;

/// An operator's name as [`ACTOR_HEADER`] carries it: a header holds
/// visible ASCII only, so every other byte (and `%`) is `%XX` (a `$USER`
/// of `jürgen` must not stop the command).
pub fn actor_to_header(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// [`actor_to_header`] undone; None for what it never writes, and for a
/// name [`actor_refusal`] refuses: such a name is never recorded, by any
/// route (a server answers 400 with the refusal where it checks first).
pub fn actor_from_header(value: &str) -> Option<String> {
    decode_actor(value).filter(|name| actor_refusal(name).is_none())
}

/// The longest operator name recorded, in characters: a label in a log's
/// BY column, not a text.
pub const ACTOR_MAX_CHARS: usize = 64;

/// Why `name` cannot be recorded as an operator's, or None when it can.
/// `events log` prints the name on one line of a table: a newline in it
/// forged a second line ("…KeyRevoked alice"), an escape sequence cleared
/// or recoloured the auditor's terminal, and a direction mark reordered
/// the line. The characters are llmgw_domain::tenancy::hidden_char's
/// (this crate has no domain; a control-plane test holds them equal).
pub fn actor_refusal(name: &str) -> Option<String> {
    if let Some(c) = name.chars().find(|c| hidden(*c)) {
        return Some(format!(
            "the operator's name (--as NAME, else the OS user) holds U+{:04X}, a control, invisible or direction character, which would print as something else in the log: give a plain name",
            u32::from(c)
        ));
    }
    if name.chars().count() > ACTOR_MAX_CHARS || actor_to_header(name).len() > COMMAND_ID_MAX {
        return Some(format!(
            "the operator's name (--as NAME, else the OS user) is too long: at most {ACTOR_MAX_CHARS} characters (fewer outside ASCII, at most {COMMAND_ID_MAX} bytes as %XX-escaped in the {ACTOR_HEADER} header)"
        ));
    }
    None
}

/// Why an [`ACTOR_HEADER`] value is refused, or None when it names an
/// operator who may be recorded.
pub fn actor_header_refusal(value: &str) -> Option<String> {
    match decode_actor(value.trim()) {
        None => Some(format!(
            "the {ACTOR_HEADER} header is not an operator's name as llmgw writes it (visible ASCII, every other byte %XX, UTF-8)"
        )),
        Some(name) => actor_refusal(&name),
    }
}

/// Control characters (C0, DEL, C1), invisible ones and the marks that
/// turn a line's direction.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

/// The `%XX` decoding alone.
fn decode_actor(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod actor_tests {
    use super::*;

    #[test]
    fn a_name_goes_through_the_header_and_back() {
        for name in ["alice", "jürgen", "ops team", "50%"] {
            let sent = actor_to_header(name);
            assert!(sent.bytes().all(|b| b.is_ascii_graphic()), "{sent}");
            assert_eq!(actor_from_header(&sent).as_deref(), Some(name));
            assert_eq!(actor_header_refusal(&sent), None);
        }
    }

    #[test]
    fn a_name_that_prints_as_something_else_is_refused() {
        let forged = "bob\n2026-12-07T18:00:00.000Z  1  key-K  KeyRevoked  alice";
        for name in [
            forged,
            "\u{1b}[2Jbob",
            "bob\u{202E}ecila",
            "a\u{200B}b",
            "x\u{9b}y",
        ] {
            let sent = actor_to_header(name);
            assert_eq!(actor_from_header(&sent), None, "{name:?}");
            let why = actor_header_refusal(&sent).unwrap();
            assert!(why.contains("control, invisible or direction"), "{why}");
        }
        let long = "a".repeat(ACTOR_MAX_CHARS + 1);
        assert_eq!(actor_from_header(&long), None);
        assert!(actor_refusal(&long).unwrap().contains("too long"));
        assert_eq!(actor_refusal(&"a".repeat(ACTOR_MAX_CHARS)), None);
        assert!(
            actor_header_refusal("%ZZ")
                .unwrap()
                .contains("not an operator's name")
        );
    }
}

/// Set on a command a standby forwarded to the leader, so that it is
/// forwarded at most once.
pub const FORWARDED_HEADER: &str = "x-llmgw-forwarded-by";
/// On an answer a server or the CLI got from the leader on an operator's
/// behalf: the leader's name and admin address, space-separated.
pub const FORWARDED_TO_HEADER: &str = "x-llmgw-forwarded-to";

/// A level of the tenancy tree in `POST /api/v1/tree`: its id, and its
/// name when it is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrg {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `POST /api/v1/tree`: an org, a team in it and a project in that, made
/// (or found) together or not at all (`keys init`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewTree {
    pub org: NewOrg,
    /// Its `org` is the org above.
    pub team: NewOrg,
    /// Its `team` is the team above.
    pub project: NewOrg,
}

/// `POST /api/v1/keys`: the server makes the secret and answers it once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewKey {
    pub project: String,
    pub name: String,
    /// bronze, silver, gold (the default) or platinum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub band: Option<String>,
    /// The person making it for themselves (the profile page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Seal the secret behind a one-time claim link instead of answering it.
    #[serde(default)]
    pub claim: bool,
    /// How long the claim link works, in seconds (the server's setting,
    /// seven days, without one); only with `claim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_ttl_secs: Option<u64>,
    /// How long the key works, in seconds from its making (1 hour to 10
    /// years); without it, until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_for_secs: Option<u64>,
}

/// How long a key made to end may work, in seconds: at least an hour
/// (less is a typo of units), at most ten years. The server and the CLI
/// check alike.
pub const KEY_VALID_SECS: std::ops::RangeInclusive<u64> = 3600..=3650 * 24 * 3600;

/// How long an old secret may keep working after a rotation, in seconds:
/// a minute to a month, as a claim link.
pub const GRACE_SECS: std::ops::RangeInclusive<u64> = 60..=30 * 24 * 3600;

/// How long a claim link may work, in seconds: a minute to a month, so
/// that a forgotten link does not keep a live key's secret sealed for
/// years.
pub const CLAIM_TTL_SECS: std::ops::RangeInclusive<u64> = 60..=30 * 24 * 3600;

/// `POST /api/v1/keys/{id}/rotate`: a new secret for the key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotateKey {
    /// How long the old secret keeps working, in seconds (1 minute to 30
    /// days), for the time it takes to deploy the new one; without it,
    /// the old one stops at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_secs: Option<u64>,
}

/// The answer to a rotation, given once: the log keeps the new hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRotated {
    pub key_id: String,
    pub prefix: String,
    pub secret: String,
    /// Until when the old secret works (RFC 3339); None: it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_until: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCreated {
    pub key_id: String,
    pub prefix: String,
    /// Shown only in this answer; the log keeps its hash. None when the
    /// key was sealed behind a claim link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The claim link's token (`<base URL>/claim/<token>`), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_token: Option<String>,
    /// When the claim link stops working (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_expires_at: Option<String>,
}

/// One person, for `llmgw users list` and the people page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRow {
    pub user_id: String,
    /// Empty once erased.
    pub email: String,
    pub name: String,
    /// pending, active, suspended or erased.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub admin: bool,
    /// RFC 3339; None once erased.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_login: Option<String>,
}

/// `POST /api/v1/users/{id}/approve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approve {
    pub project: String,
}

/// `POST /api/v1/users/{id}/reset-password`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetPassword {
    pub password: String,
}

/// `POST /api/v1/users`: a person an operator adds (sign-up may be
/// closed), approved to a project at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewUser {
    pub email: String,
    /// Shown on the pages; the email without it.
    #[serde(default)]
    pub name: String,
    pub password: String,
    /// The project they may use.
    pub project: String,
}

/// One level's limits as set there (not composed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u32>,
    /// Absent: every model; empty: none (the scope is suspended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Micro-units per period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_micros: Option<u64>,
    /// day or month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
}

/// `PUT /api/v1/limits`: the fields given replace those of the level;
/// `clear` first drops everything set there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetLimits {
    /// org, team, project or key.
    pub scope: String,
    pub id: String,
    #[serde(default)]
    pub clear: bool,
    #[serde(default)]
    pub limits: LevelLimits,
    /// Drop the level's allowlist (every model again).
    #[serde(default)]
    pub all_models: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRow {
    pub key_id: String,
    pub prefix: String,
    pub project: String,
    pub name: String,
    pub band: String,
    /// active, unclaimed, expired, stopped (its person erased) or revoked.
    pub state: String,
    /// The person who made it for themselves, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The key's own level.
    pub limits: LevelLimits,
    /// RFC 3339, from the usage the log holds; None when never used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<String>,
    /// When it stops working (RFC 3339), for a key made to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// After a rotation with a grace: until when the old secret works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_until: Option<String>,
    /// And its prefix, so the two can be told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_prefix: Option<String>,
}

/// `POST /api/v1/join-tokens`: a single-use token for one node to join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTokenRequest {
    /// How long it may be used, in milliseconds.
    pub ttl_ms: u64,
    /// The node it may join as; none lets the node name itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A join token, answered once: only its hash is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinToken {
    /// `llmgw-join-<secret>.<pin>`, for `llmgw agent run --join`.
    pub token: String,
    /// Its id, as the log and the server's log name it.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// RFC 3339.
    pub expires_at: String,
    /// Where agents dial the leader (its advertised agent address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_url: Option<String>,
}

/// `PUT /api/v1/projects/{id}/threads`: whether the project keeps threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetThreads {
    /// Off: no more writes; the next sweep deletes what is left.
    #[serde(default)]
    pub off: bool,
    /// Keep the model's replies too (capped).
    #[serde(default)]
    pub capture: bool,
    /// Hours since a thread's last write; required unless `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_hours: Option<u32>,
}

/// `PUT /api/v1/projects/{id}/memory`: whether the project keeps notes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetMemory {
    #[serde(default)]
    pub off: bool,
    /// Hours since a note's last write; required unless `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_hours: Option<u32>,
}

/// `GET /api/v1/groups`: one row a level of the tenancy tree, each org
/// followed by its teams and each team by its projects; `?org=`,
/// `?team=` or `?project=` keep one group and what lies under it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRow {
    /// org, team or project.
    pub scope: String,
    pub id: String,
    pub name: String,
    /// The org of a team, the team of a project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The level's own limits (not composed).
    pub limits: LevelLimits,
    /// What the log holds as spent in `spent_period` (the level's budget
    /// period, or the month without a budget), in micro-units.
    pub spent_micros: u64,
    /// day or month.
    pub spent_period: String,
    /// Requests counted under the group, ever.
    pub requests: u64,
    /// Live keys under the group.
    pub keys: u64,
    /// A project's threads setting, when it keeps threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<ThreadsRow>,
    /// Hours a project's memory notes are kept, when it keeps them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_retain_hours: Option<u32>,
}

impl GroupRow {
    /// How deep in the tree: 0 for an org, 1 for a team, 2 for a project.
    pub fn depth(&self) -> usize {
        match self.scope.as_str() {
            "org" => 0,
            "team" => 1,
            _ => 2,
        }
    }
}

/// A project's threads, as set with `llmgw keys threads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadsRow {
    /// The model's replies are kept too.
    pub capture: bool,
    pub retain_hours: u32,
}
