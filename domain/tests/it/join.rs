//! Join tokens and the deny list, as an operator and a node notice them.

use llmgw_domain::join::{JoinCommand as C, JoinEvent, MAX_TTL_MS};
use llmgw_domain::nodes::NodeEvent;
use llmgw_domain::{Command, Event, RejectionCode, State, UnixMillis};

fn hash(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn run(state: &mut State, c: C) -> Result<Vec<Event>, llmgw_domain::Rejection> {
    let events = state.decide(Command::Join(c))?;
    for e in &events {
        state.evolve(e);
    }
    Ok(events)
}

fn issue(state: &mut State, n: u8, node: Option<&str>, now: i64, ttl: i64) {
    run(
        state,
        C::IssueToken {
            token_hash: hash(n),
            node_id: node.map(Into::into),
            expires_at: UnixMillis(now + ttl),
            now: UnixMillis(now),
        },
    )
    .expect("issued");
}

fn redeem(
    state: &mut State,
    n: u8,
    node: &str,
    cert: u8,
    now: i64,
) -> Result<Vec<Event>, llmgw_domain::Rejection> {
    run(
        state,
        C::Redeem {
            token_hash: hash(n),
            node_id: node.into(),
            certificate: hash(cert),
            now: UnixMillis(now),
        },
    )
}

#[test]
fn a_token_joins_one_node_once_before_it_expires() {
    let mut s = State::default();
    issue(&mut s, 1, None, 0, 60_000);
    let joined = redeem(&mut s, 1, "a", 100, 1_000).unwrap();
    assert_eq!(
        joined,
        vec![Event::Join(JoinEvent::NodeJoined {
            token_id: hash(1)[..12].to_owned(),
            node_id: "a".into(),
            certificate: hash(100),
        })]
    );
    assert_eq!(
        joined[0].stream_id(),
        format!("jointoken-{}", &hash(1)[..12])
    );
    // Used: refused with who used it, whoever asks.
    let again = redeem(&mut s, 1, "b", 101, 2_000).unwrap_err();
    assert_eq!(again.code, RejectionCode::Conflict);
    assert!(
        again.reason.contains("already used (by node a)"),
        "{}",
        again.reason
    );
    // Expired: refused, saying how long ago.
    issue(&mut s, 2, None, 0, 60_000);
    let late = redeem(&mut s, 2, "b", 102, 60_000 + 300_000).unwrap_err();
    assert!(late.reason.contains("expired 5 min ago"), "{}", late.reason);
    // Unknown: the one answer any guess gets, naming no token.
    let guess = redeem(&mut s, 9, "b", 103, 0).unwrap_err();
    assert_eq!(guess.code, RejectionCode::NotFound);
    assert!(!guess.reason.contains(&hash(9)[..12]));
    // A token for a node joins that node only.
    issue(&mut s, 3, Some("c"), 0, 60_000);
    let other = redeem(&mut s, 3, "b", 104, 0).unwrap_err();
    assert!(
        other.reason.contains("is for node c, not b"),
        "{}",
        other.reason
    );
    redeem(&mut s, 3, "c", 104, 0).unwrap();
}

#[test]
fn a_token_lasts_a_while_and_at_most_a_week() {
    let mut s = State::default();
    for ttl in [0, -1, MAX_TTL_MS + 1] {
        let e = run(
            &mut s,
            C::IssueToken {
                token_hash: hash(1),
                node_id: None,
                expires_at: UnixMillis(1_000 + ttl),
                now: UnixMillis(1_000),
            },
        )
        .unwrap_err();
        assert_eq!(e.code, RejectionCode::Invalid, "{ttl}");
    }
    let bad_hash = run(
        &mut s,
        C::IssueToken {
            token_hash: "the secret itself".into(),
            node_id: None,
            expires_at: UnixMillis(2),
            now: UnixMillis(1),
        },
    );
    assert!(bad_hash.is_err(), "only a hash is ever recorded");
    issue(&mut s, 1, None, 0, MAX_TTL_MS);
}

#[test]
fn a_removed_node_is_refused_until_it_joins_again_and_its_old_certificate_for_ever() {
    let mut s = State::default();
    issue(&mut s, 1, Some("a"), 0, 60_000);
    redeem(&mut s, 1, "a", 100, 0).unwrap();
    assert_eq!(s.joining.refusal(&"a".into(), &hash(100)), None);
    let removed = run(
        &mut s,
        C::RemoveNode {
            node_id: "a".into(),
        },
    )
    .unwrap();
    assert_eq!(
        removed,
        vec![Event::Node(NodeEvent::NodeRemoved {
            node_id: "a".into(),
            certificates: vec![hash(100)],
        })]
    );
    assert_eq!(removed[0].stream_id(), "node-a");
    // The way back passes the token in the environment, never as --join,
    // which shows it to every local user.
    let back = "`LLMGW_AGENT_JOIN=TOKEN llmgw agent run …`";
    let why = s.joining.refusal(&"a".into(), &hash(100)).expect("refused");
    assert!(why.contains("revoked when node a was removed"), "{why}");
    assert!(why.contains(back) && !why.contains("--join"), "{why}");
    // Any certificate naming it (one issued by hand too).
    let why = s.joining.refusal(&"a".into(), &hash(7)).expect("refused");
    assert!(why.contains("node a was removed from the cluster"), "{why}");
    assert!(why.contains(back) && !why.contains("--join"), "{why}");
    assert_eq!(s.joining.refusal(&"b".into(), &hash(7)), None);
    // Removing it again changes nothing; an unknown node is not found.
    assert!(
        run(
            &mut s,
            C::RemoveNode {
                node_id: "a".into()
            }
        )
        .unwrap()
        .is_empty()
    );
    let unknown = run(
        &mut s,
        C::RemoveNode {
            node_id: "z".into(),
        },
    )
    .unwrap_err();
    assert_eq!(unknown.code, RejectionCode::NotFound);
    // A new token brings it back; the old certificate stays refused.
    issue(&mut s, 2, Some("a"), 0, 60_000);
    redeem(&mut s, 2, "a", 101, 0).unwrap();
    assert_eq!(s.joining.refusal(&"a".into(), &hash(101)), None);
    assert!(s.joining.refusal(&"a".into(), &hash(100)).is_some());
}

#[test]
fn removing_a_registered_node_takes_it_out_of_the_cluster() {
    let mut s = State::default();
    s.evolve(&Event::Node(NodeEvent::NodeRegistered {
        node_id: "a".into(),
        inventory: crate::nodes::inventory(1),
    }));
    let removed = run(
        &mut s,
        C::RemoveNode {
            node_id: "a".into(),
        },
    )
    .unwrap();
    assert_eq!(removed.len(), 1);
    assert!(!s.nodes.nodes.contains_key("a"));
    // It registers afresh once allowed back.
    s.evolve(&Event::Node(NodeEvent::NodeRegistered {
        node_id: "a".into(),
        inventory: crate::nodes::inventory(1),
    }));
    assert!(s.nodes.nodes["a"].schedulable());
}
