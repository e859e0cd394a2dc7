use std::collections::BTreeSet;

use llmgw_domain::tenancy::{
    Allowed, Band, Key, Limits, Period, Scope, Tenancy, TenancyCommand as C, TenancyEvent as E,
    compose,
};
use llmgw_domain::time::UnixMillis;

pub(crate) fn key(id: &str, project: &str) -> Key {
    Key {
        key_id: id.into(),
        project_id: project.into(),
        // Live names are unique per project: one per id keeps tests apart.
        name: format!("ci-{id}"),
        hash: "ab".repeat(32),
        prefix: "llmgw-3f2a".into(),
        band: Band::Silver,
        routing_profile: None,
        revoked: false,
        owner: None,
        claim_by: None,
        expires_at: None,
        previous: None,
    }
}

pub(crate) fn tree() -> Tenancy {
    let mut t = Tenancy::default();
    for cmd in [
        C::CreateOrg {
            org_id: "o".into(),
            name: "Acme".into(),
        },
        C::CreateTeam {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "ML".into(),
        },
        C::CreateProject {
            project_id: "p".into(),
            team_id: "t".into(),
            name: "chat".into(),
        },
        C::IssueKey(key("k", "p")),
    ] {
        for e in t.decide(cmd).expect("accepted") {
            t.evolve(&e);
        }
    }
    t
}

fn set(t: &mut Tenancy, scope: Scope, id: &str, limits: Limits) {
    for e in t
        .decide(C::SetLimits {
            scope,
            scope_id: id.into(),
            limits,
        })
        .expect("accepted")
    {
        t.evolve(&e);
    }
}

fn only(names: &[&str]) -> Allowed {
    Allowed::Only(names.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>())
}

#[test]
fn limits_compose_as_the_most_restrictive_value() {
    let mut t = tree();
    set(
        &mut t,
        Scope::Org,
        "o",
        Limits {
            rpm: Some(600),
            tpm: Some(100_000),
            ..Limits::default()
        },
    );
    set(
        &mut t,
        Scope::Project,
        "p",
        Limits {
            rpm: Some(60),
            ..Limits::default()
        },
    );
    set(
        &mut t,
        Scope::Key,
        "k",
        Limits {
            tpm: Some(200_000),
            ..Limits::default()
        },
    );
    let e = t.effective("k", str::to_owned);
    assert_eq!(
        (e.rpm, e.tpm, e.models),
        (Some(60), Some(100_000), Allowed::All)
    );
    // Each level keeps its own rates: a group's limit counts for the group.
    let levels: Vec<_> = e
        .rates
        .iter()
        .map(|r| (r.scope, r.scope_id.as_str(), r.rpm, r.tpm))
        .collect();
    assert_eq!(
        levels,
        vec![
            (Scope::Org, "o", Some(600), Some(100_000)),
            (Scope::Project, "p", Some(60), None),
            (Scope::Key, "k", None, Some(200_000)),
        ]
    );
}

#[test]
fn each_budget_level_is_kept_with_its_own_period() {
    let mut t = tree();
    set(
        &mut t,
        Scope::Org,
        "o",
        Limits {
            budget_micros: Some(1_000_000),
            period: Some(Period::Month),
            ..Limits::default()
        },
    );
    set(
        &mut t,
        Scope::Key,
        "k",
        Limits {
            budget_micros: Some(5_000),
            period: Some(Period::Day),
            ..Limits::default()
        },
    );
    let e = t.effective("k", str::to_owned);
    let levels: Vec<_> = e
        .budgets
        .iter()
        .map(|b| (b.scope, b.scope_id.as_str(), b.micros, b.period))
        .collect();
    assert_eq!(
        levels,
        vec![
            (Scope::Org, "o", 1_000_000, Period::Month),
            (Scope::Key, "k", 5_000, Period::Day)
        ]
    );
}

#[test]
fn allowlists_intersect_absent_means_all_and_empty_means_none() {
    let canonical = |m: &str| {
        if m == "llama" {
            "llama-3.1-8b".to_string()
        } else {
            m.to_string()
        }
    };
    let l = |models: Option<&[&str]>| Limits {
        models: models.map(|m| m.iter().map(|s| s.to_string()).collect()),
        ..Limits::default()
    };
    let org = l(Some(&["llama", "qwen-7b", "mistral"]));
    let team = l(None);
    let project = l(Some(&["llama-3.1-8b", "qwen-7b"]));
    let e = compose(
        [
            (Scope::Org, "o", &org),
            (Scope::Team, "t", &team),
            (Scope::Project, "p", &project),
        ],
        canonical,
    );
    assert_eq!(e.models, only(&["llama-3.1-8b", "qwen-7b"]));
    assert!(e.models.permits("llama-3.1-8b") && !e.models.permits("mistral"));
    let suspended = l(Some(&[]));
    let e = compose(
        [(Scope::Org, "o", &org), (Scope::Project, "p", &suspended)],
        canonical,
    );
    assert_eq!(e.models, only(&[]));
    assert!(!e.models.permits("qwen-7b"));
    let none = compose([(Scope::Org, "o", &team)], canonical);
    assert_eq!(none.models, Allowed::All);
}

#[test]
fn ambiguous_or_dangling_limits_are_refused() {
    let t = tree();
    let zero = t.decide(C::SetLimits {
        scope: Scope::Key,
        scope_id: "k".into(),
        limits: Limits {
            rpm: Some(0),
            ..Limits::default()
        },
    });
    assert!(
        zero.unwrap_err()
            .reason
            .contains("rpm and tpm must be positive")
    );
    let no_period = t.decide(C::SetLimits {
        scope: Scope::Key,
        scope_id: "k".into(),
        limits: Limits {
            budget_micros: Some(5),
            ..Limits::default()
        },
    });
    assert!(
        no_period
            .unwrap_err()
            .reason
            .contains("a budget needs a period")
    );
    let ghost = t.decide(C::SetLimits {
        scope: Scope::Team,
        scope_id: "nope".into(),
        limits: Limits::default(),
    });
    assert!(ghost.unwrap_err().reason.contains("no team nope"));
}

#[test]
fn keys_are_only_hashes_and_revocation_is_soft() {
    let mut t = tree();
    let mut raw = key("k2", "p");
    raw.hash = "llmgw-sk-live-secret".into();
    assert!(
        t.decide(C::IssueKey(raw))
            .unwrap_err()
            .reason
            .contains("hex SHA-256")
    );
    let events = t
        .decide(C::RevokeKey {
            key_id: "k".into(),
            by: "ops".into(),
        })
        .unwrap();
    for e in &events {
        t.evolve(e);
    }
    assert!(t.keys["k"].revoked, "kept, marked revoked");
    // Limits on it would change nothing: refused, where LimitsSet was
    // written (and said "are set"), a clear included.
    for limits in [
        Limits {
            rpm: Some(5),
            ..Limits::default()
        },
        Limits::default(),
    ] {
        let set = t.decide(C::SetLimits {
            scope: Scope::Key,
            scope_id: "k".into(),
            limits,
        });
        assert_eq!(set.unwrap_err().reason, "key k is revoked");
    }
    assert_eq!(
        t.decide(C::RevokeKey {
            key_id: "k".into(),
            by: "ops".into()
        })
        .unwrap(),
        vec![]
    );
    let encoded = serde_json::to_string(&E::KeyIssued(key("k3", "p"))).unwrap();
    assert!(!encoded.contains("secret"));
}

#[test]
fn a_live_key_name_is_unique_within_its_project() {
    let mut t = tree();
    let mut twin = key("k2", "p");
    twin.name = "ci-k".into();
    let refused = t.decide(C::IssueKey(twin.clone())).unwrap_err();
    assert_eq!(refused.code, llmgw_domain::RejectionCode::Conflict);
    assert_eq!(
        refused.reason,
        "project p already has a key named ci-k: choose another name"
    );
    // A name is a line's worth of text, and no control characters; and
    // something: it tells the keys apart.
    for name in [
        "x".repeat(101),
        "a\u{1b}[2Jb".to_owned(),
        "evil\u{202E}gpj.exe".to_owned(),
        "zero\u{200B}width".to_owned(),
        String::new(),
        " ".to_owned(),
    ] {
        let mut long = key("k9", "p");
        long.name = name;
        let refused = t.decide(C::IssueKey(long)).unwrap_err();
        assert_eq!(refused.code, llmgw_domain::RejectionCode::Invalid);
    }
    // Another project may use the name.
    for cmd in [
        C::CreateProject {
            project_id: "q".into(),
            team_id: "t".into(),
            name: "batch".into(),
        },
        C::IssueKey(key("k3", "q")),
    ] {
        for e in t.decide(cmd).unwrap() {
            t.evolve(&e);
        }
    }
    let mut elsewhere = key("k4", "q");
    elsewhere.name = "ci-k".into();
    assert!(t.decide(C::IssueKey(elsewhere)).is_ok());
    // A person's own keys are told apart among theirs: the name an
    // operator's key has is theirs to use too, and a second of their own
    // by that name is refused without naming anyone else's.
    for e in t
        .decide(C::SignUp {
            user_id: "usr-a".into(),
        })
        .unwrap()
    {
        t.evolve(&e);
    }
    let mut own = key("k5", "p");
    own.name = "ci-k".into();
    own.owner = Some("usr-a".into());
    for e in t.decide(C::IssueKey(own.clone())).unwrap() {
        t.evolve(&e);
    }
    own.key_id = "k6".into();
    assert_eq!(
        t.decide(C::IssueKey(own.clone())).unwrap_err().reason,
        "usr-a already has a key named ci-k in project p: choose another name"
    );
    // A person holds a bounded number of live keys (each is in the log for
    // good); a revoked one frees its place.
    for i in 1..llmgw_domain::tenancy::MAX_KEYS_PER_PERSON {
        let mut more = own.clone();
        more.key_id = format!("own-{i}");
        more.name = format!("laptop {i}");
        for e in t.decide(C::IssueKey(more)).unwrap() {
            t.evolve(&e);
        }
    }
    let mut one_more = own.clone();
    one_more.key_id = "own-extra".into();
    one_more.name = "one more".into();
    assert_eq!(
        t.decide(C::IssueKey(one_more.clone())).unwrap_err().reason,
        "usr-a already has 25 live keys, the most one person may hold: revoke one first"
    );
    for e in t
        .decide(C::RevokeKey {
            key_id: "own-1".into(),
            by: "usr-a".into(),
        })
        .unwrap()
    {
        t.evolve(&e);
    }
    assert!(t.decide(C::IssueKey(one_more)).is_ok());
    // Once the holder of the name is revoked, the name is free again.
    for e in t
        .decide(C::RevokeKey {
            key_id: "k".into(),
            by: "ops".into(),
        })
        .unwrap()
    {
        t.evolve(&e);
    }
    assert_eq!(
        t.decide(C::IssueKey(twin.clone())).unwrap(),
        vec![E::KeyIssued(twin)]
    );
}

#[test]
fn creating_the_same_thing_twice_is_a_no_op_and_a_clash_is_refused() {
    let t = tree();
    assert_eq!(
        t.decide(C::CreateOrg {
            org_id: "o".into(),
            name: "Acme".into()
        })
        .unwrap(),
        vec![]
    );
    let clash = t
        .decide(C::CreateOrg {
            org_id: "o".into(),
            name: "Other".into(),
        })
        .unwrap_err();
    // It names what differs, as it stands: it said "with other details".
    assert_eq!(
        clash.reason,
        r#"org o already exists named "Acme"; creating it again cannot rename it"#
    );
    let mut t = t;
    run(
        &mut t,
        C::CreateTeam {
            team_id: "t2".into(),
            org_id: "o".into(),
            name: "Ops".into(),
        },
    );
    let moved = t
        .decide(C::CreateProject {
            project_id: "p".into(),
            team_id: "t2".into(),
            name: "chat".into(),
        })
        .unwrap_err();
    assert_eq!(
        moved.reason,
        "project p already exists in team t; creating it again cannot move it"
    );
    let both = t
        .decide(C::CreateTeam {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "Ops".into(),
        })
        .unwrap_err();
    assert!(both.reason.contains(r#"team t already exists named "ML""#));
    let orphan = t.decide(C::CreateProject {
        project_id: "q".into(),
        team_id: "ghost".into(),
        name: "x".into(),
    });
    assert!(orphan.unwrap_err().reason.contains("no team ghost"));
}

fn run(t: &mut Tenancy, cmd: C) -> Vec<E> {
    let events = t.decide(cmd).expect("accepted");
    for e in &events {
        t.evolve(e);
    }
    events
}

#[test]
fn a_person_is_approved_into_a_project_and_an_erased_one_stays_powerless() {
    use llmgw_domain::tenancy::UserStatus;
    let mut t = tree();
    let u = || "usr-1".to_owned();
    run(&mut t, C::SignUp { user_id: u() });
    assert_eq!(t.users["usr-1"].status, UserStatus::Pending);
    // Approval needs a project that exists.
    let nowhere = t.decide(C::Approve {
        user_id: u(),
        project_id: "ghost".into(),
        by: "ops".into(),
    });
    assert!(nowhere.unwrap_err().reason.contains("no project ghost"));
    run(
        &mut t,
        C::Approve {
            user_id: u(),
            project_id: "p".into(),
            by: "ops".into(),
        },
    );
    assert_eq!(t.users["usr-1"].status, UserStatus::Active);
    run(
        &mut t,
        C::Promote {
            user_id: u(),
            by: "ops".into(),
        },
    );
    assert!(t.users["usr-1"].admin);
    // The last active admin is neither suspended nor erased: the admin
    // pages would answer no one.
    for cmd in [
        C::Suspend {
            user_id: u(),
            by: "ops".into(),
        },
        C::Erase {
            user_id: u(),
            by: "ops".into(),
        },
    ] {
        let why = t.decide(cmd).unwrap_err().reason;
        assert!(why.contains("the last active admin"), "{why}");
    }
    let other = || "usr-2".to_owned();
    run(&mut t, C::SignUp { user_id: other() });
    run(
        &mut t,
        C::Approve {
            user_id: other(),
            project_id: "p".into(),
            by: "ops".into(),
        },
    );
    run(
        &mut t,
        C::Promote {
            user_id: other(),
            by: "ops".into(),
        },
    );
    let erased = run(
        &mut t,
        C::Erase {
            user_id: u(),
            by: "ops".into(),
        },
    );
    assert_eq!(erased.len(), 1);
    assert_eq!(t.users["usr-1"].status, UserStatus::Erased);
    assert!(!t.users["usr-1"].admin, "an erased person is no admin");
    // Nothing brings an erased person back, and erasing twice changes nothing.
    for cmd in [
        C::Approve {
            user_id: u(),
            project_id: "p".into(),
            by: "ops".into(),
        },
        C::ResetPassword {
            user_id: u(),
            by: "ops".into(),
        },
        C::ChangePassword { user_id: u() },
    ] {
        assert!(t.decide(cmd).unwrap_err().reason.contains("erased"));
    }
    assert_eq!(
        t.decide(C::Erase {
            user_id: u(),
            by: "ops".into()
        })
        .unwrap(),
        vec![]
    );
}

#[test]
fn a_claim_link_is_offered_and_claimed_only_for_a_live_key() {
    let mut t = tree();
    let offer = |t: &Tenancy, id: &str| {
        t.decide(C::OfferClaim {
            key_id: id.into(),
            by: "ops".into(),
            until: None,
        })
    };
    let claim = |t: &Tenancy| t.decide(C::Claim { key_id: "k".into() });
    assert!(
        offer(&t, "nope")
            .unwrap_err()
            .reason
            .contains("no key nope")
    );
    assert_eq!(offer(&t, "k").unwrap().len(), 1);
    assert_eq!(claim(&t).unwrap().len(), 1);
    run(
        &mut t,
        C::RevokeKey {
            key_id: "k".into(),
            by: "ops".into(),
        },
    );
    assert!(offer(&t, "k").unwrap_err().reason.contains("revoked"));
    assert!(claim(&t).unwrap_err().reason.contains("revoked"));
}

#[test]
fn a_key_whose_claim_link_ends_unused_opens_nothing_from_then_on() {
    let end = UnixMillis(10_000);
    let mut t = tree();
    run(
        &mut t,
        C::OfferClaim {
            key_id: "k".into(),
            by: "ops".into(),
            until: Some(end),
        },
    );
    let works = |t: &Tenancy, at: i64| t.key_works(&t.keys["k"], UnixMillis(at));
    assert!(works(&t, 9_999), "the link is open: the key works");
    assert!(!works(&t, 10_000), "the link ended unused: the key stops");
    assert!(t.key_stands(&t.keys["k"]), "no clock: it is not revoked");
    // Limits on it are refused once the link has ended, as on a revoked key.
    let limits = |t: &Tenancy, at: i64| t.limits_refusal_at(Scope::Key, "k", UnixMillis(at));
    assert_eq!(limits(&t, 9_999), Ok(()));
    assert_eq!(
        limits(&t, 10_000).unwrap_err().reason,
        "key k's claim link expired unclaimed: it opens nothing; make a new key for whoever missed the link"
    );
    assert_eq!(
        t.limits_refusal_at(Scope::Project, "k", UnixMillis(10_000)),
        Ok(())
    );
    run(&mut t, C::Claim { key_id: "k".into() });
    assert!(works(&t, 1_000_000), "claimed: its holder keeps it");
    assert_eq!(limits(&t, 1_000_000), Ok(()));

    // A link offered before links' ends were logged holds the key to none.
    let old = r#"{"key_id": "k", "by": "ops"}"#;
    let Ok(llmgw_domain::Event::Tenancy(old)) =
        llmgw_domain::Event::decode_json("KeyClaimOffered", 1, old)
    else {
        panic!("a stored KeyClaimOffered without its end reads");
    };
    let mut t = tree();
    t.evolve(&old);
    assert!(works(&t, i64::MAX));
}

#[test]
fn a_project_stands_for_its_people_with_its_own_limits() {
    let mut t = tree();
    set(
        &mut t,
        Scope::Team,
        "t",
        Limits {
            rpm: Some(5),
            ..Limits::default()
        },
    );
    set(
        &mut t,
        Scope::Key,
        "k",
        Limits {
            rpm: Some(1),
            ..Limits::default()
        },
    );
    let chain = t.project_chain("p");
    assert_eq!(
        chain,
        vec![
            (Scope::Org, "o".to_owned()),
            (Scope::Team, "t".to_owned()),
            (Scope::Project, "p".to_owned())
        ]
    );
    // The team's limit applies; the key's does not (a person is no key).
    let e = t.project_effective("p", str::to_owned);
    assert_eq!(e.rates.len(), 1, "{e:?}");
}

#[test]
fn a_key_for_a_person_needs_the_person() {
    let mut t = tree();
    let mut theirs = key("k2", "p");
    theirs.owner = Some("u-1".into());
    let refused = t.decide(C::IssueKey(theirs.clone())).unwrap_err();
    assert!(
        refused.reason.contains("no person u-1"),
        "{}",
        refused.reason
    );
    for e in t
        .decide(C::SignUp {
            user_id: "u-1".into(),
        })
        .unwrap()
    {
        t.evolve(&e);
    }
    assert_eq!(t.decide(C::IssueKey(theirs)).unwrap().len(), 1);
}

/// A key is cut to what `keys list` shows wherever it appears in a text
/// bound for the log.
#[test]
fn keys_in_a_refusal_are_cut_to_their_prefix() {
    use llmgw_domain::audit::redact_secrets;
    let key = "llmgw-sk-b1f688d2a2ef4ff8a03ab5935bd0749b9facbc95a4bf4496";
    assert_eq!(
        redact_secrets(&format!("RevokeKey {key}")),
        "RevokeKey llmgw-sk-b1f…"
    );
    assert_eq!(
        redact_secrets(&format!("audit-key-{key} and {key}.")),
        "audit-key-llmgw-sk-b1f… and llmgw-sk-b1f…."
    );
    assert_eq!(redact_secrets("no key key-12ab"), "no key key-12ab");
    assert_eq!(redact_secrets("llmgw-sk-ab"), "llmgw-sk-ab");
}

#[test]
fn a_key_made_to_end_opens_nothing_from_its_end() {
    let mut t = tree();
    let mut k = key("e", "p");
    k.expires_at = Some(UnixMillis(5_000));
    run(&mut t, C::IssueKey(k));
    let works = |t: &Tenancy, at: i64| t.key_works(&t.keys["e"], UnixMillis(at));
    assert!(works(&t, 4_999));
    assert!(!works(&t, 5_000), "its end came");
    let limits = |at: i64| t.limits_refusal_at(Scope::Key, "e", UnixMillis(at));
    assert_eq!(limits(4_999), Ok(()));
    assert_eq!(
        limits(5_000).unwrap_err().reason,
        "key e has expired: it opens nothing; make a new key"
    );
}

#[test]
fn a_rotated_key_keeps_its_id_and_its_old_secret_only_for_the_grace() {
    let mut t = tree();
    let rotate = |hash: &str, until: Option<i64>| C::RotateKey {
        key_id: "k".into(),
        replaces: None,
        hash: hash.repeat(32),
        prefix: "llmgw-sk-new".into(),
        previous_until: until.map(UnixMillis),
        by: "ops".into(),
    };
    let events = run(&mut t, rotate("cd", Some(9_000)));
    assert!(matches!(&events[..], [E::KeyRotated { key_id, .. }] if key_id == "k"));
    let k = &t.keys["k"];
    assert_eq!(
        (k.hash.as_str(), k.prefix.as_str()),
        (&*"cd".repeat(32), "llmgw-sk-new")
    );
    let old = k.previous.as_ref().expect("the old secret, in its grace");
    assert_eq!(
        (old.hash.as_str(), old.until),
        (&*"ab".repeat(32), UnixMillis(9_000))
    );

    // A second rotation ends the first one's grace; one without a grace
    // keeps no old secret at all.
    run(&mut t, rotate("ef", None));
    assert_eq!(t.keys["k"].previous, None);
    assert_eq!(t.keys["k"].hash, "ef".repeat(32));

    // Two rotations at once: the one decided second names a secret that
    // is no longer the key's, and is refused rather than printing a
    // secret the first one's made useless.
    let mut stale = rotate("77", None);
    if let C::RotateKey { replaces, .. } = &mut stale {
        *replaces = Some("cd".repeat(32));
    }
    let why = t.decide(stale).unwrap_err().reason;
    assert!(why.contains("was rotated meanwhile"), "{why}");
    let mut current = rotate("77", None);
    if let C::RotateKey { replaces, .. } = &mut current {
        *replaces = Some("ef".repeat(32));
    }
    assert!(t.decide(current).is_ok());

    // A secret in use, a revoked key, a key behind an unused claim link
    // and an unknown one are refused.
    let taken = t.decide(rotate("ef", None)).unwrap_err();
    assert_eq!(taken.reason, "that secret is already in use");
    assert!(t.decide(rotate("zz", None)).is_err(), "not a hash");
    run(
        &mut t,
        C::OfferClaim {
            key_id: "k".into(),
            by: "ops".into(),
            until: Some(UnixMillis(50_000)),
        },
    );
    let sealed = t.decide(rotate("01", None)).unwrap_err();
    assert!(
        sealed.reason.contains("claim link is unused"),
        "{}",
        sealed.reason
    );
    run(&mut t, C::Claim { key_id: "k".into() });
    run(
        &mut t,
        C::RevokeKey {
            key_id: "k".into(),
            by: "ops".into(),
        },
    );
    let revoked = t.decide(rotate("01", None)).unwrap_err();
    assert_eq!(revoked.reason, "k is revoked: make a new key");
    let mut unknown = rotate("01", None);
    if let C::RotateKey { key_id, .. } = &mut unknown {
        *key_id = "nope".into();
    }
    assert_eq!(t.decide(unknown).unwrap_err().reason, "no key nope");
}

#[test]
fn a_person_moved_to_another_project_loses_their_own_keys_in_the_old_one() {
    let mut t = tree();
    for project_id in ["q", "r"] {
        run(
            &mut t,
            C::CreateProject {
                project_id: project_id.into(),
                team_id: "t".into(),
                name: project_id.into(),
            },
        );
    }
    run(
        &mut t,
        C::SignUp {
            user_id: "usr-1".into(),
        },
    );
    let approve = |project: &str| C::Approve {
        user_id: "usr-1".into(),
        project_id: project.into(),
        by: "ops".into(),
    };
    run(&mut t, approve("p"));
    let mut own = |id: &str, project: &str| {
        let mut k = key(id, project);
        k.owner = Some("usr-1".into());
        run(&mut t, C::IssueKey(k));
    };
    own("mine-p", "p");
    own("given-r", "r");
    // Suspended and approved again into the same project: nothing moves.
    run(
        &mut t,
        C::Suspend {
            user_id: "usr-1".into(),
            by: "ops".into(),
        },
    );
    assert_eq!(run(&mut t, approve("p")).len(), 1);
    assert!(!t.keys["mine-p"].revoked);
    // Moved: their own key in the project they left is revoked, by whoever
    // moved them; one an operator gave them elsewhere is not.
    let events = run(&mut t, approve("q"));
    assert_eq!(
        events[1..],
        [E::KeyRevoked {
            key_id: "mine-p".into(),
            by: "ops".into()
        }]
    );
    assert!(t.keys["mine-p"].revoked);
    assert!(!t.keys["given-r"].revoked);
    assert!(!t.keys["k"].revoked, "an operator's key of p stays");
}

#[test]
fn a_key_of_an_erased_person_gets_no_new_secret() {
    let mut t = tree();
    run(
        &mut t,
        C::SignUp {
            user_id: "usr-1".into(),
        },
    );
    let mut k = key("theirs", "p");
    k.owner = Some("usr-1".into());
    run(&mut t, C::IssueKey(k));
    run(
        &mut t,
        C::Erase {
            user_id: "usr-1".into(),
            by: "ops".into(),
        },
    );
    let why = t
        .decide(C::RotateKey {
            key_id: "theirs".into(),
            replaces: None,
            hash: "cd".repeat(32),
            prefix: "llmgw-sk-new".into(),
            previous_until: None,
            by: "ops".into(),
        })
        .unwrap_err()
        .reason;
    assert!(why.contains("belonged to a person who was erased"), "{why}");
    let limits = t.decide(C::SetLimits {
        scope: Scope::Key,
        scope_id: "theirs".into(),
        limits: Limits {
            rpm: Some(3),
            ..Limits::default()
        },
    });
    assert!(limits.unwrap_err().reason.contains("was erased"));
}
