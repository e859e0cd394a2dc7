//! node-lost-live: positions 1..=21, captured with
//! `llmgw events capture node-lost-live --from 1 --to 21`.
//! The snapshot is the incident as the views saw it (ids named in order
//! of appearance, host facts blanked, times from the first event). Say
//! below what should have happened, as you would tell it.

use llmgw_replay_tests::timeline::Timeline;

#[test]
fn node_lost_live() {
    let t = Timeline::fixture("node-lost-live");
    insta::assert_snapshot!("story", t.story());
    // What should have happened, for example:
    // let lost = t.first("NodeLost", "a");
    // assert!(t.between(t.first("NodeUnreachable", "a"), lost) <= t.setting("lost_after"));
    // let ready = t.first("ReplicaReady", "R3");
    // assert!(t.between(lost, ready) < std::time::Duration::from_secs(60));
    // let served = t.first("ReplicaReady", "R1");
    // t.never("chat unroutable once served", |v| v.checkpoint.position > served.position && v.router.endpoints_for("chat").count() == 0);
}
