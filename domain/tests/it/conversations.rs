use llmgw_domain::RejectionCode;
use llmgw_domain::conversations::{MemorySetting, ThreadsSetting};
use llmgw_domain::tenancy::{TenancyCommand as C, TenancyEvent as E};

use crate::tenancy::tree;

#[test]
fn threads_and_memory_are_off_until_switched_on_with_a_retention() {
    let mut t = tree();
    assert!(t.threads.is_empty() && t.memory.is_empty());
    let on = ThreadsSetting {
        capture: true,
        retain_hours: 48,
    };
    let events = t
        .decide(C::SetThreads {
            project_id: "p".into(),
            setting: Some(on),
            by: "ops".into(),
        })
        .unwrap();
    assert_eq!(
        events,
        vec![E::ThreadsSet {
            project_id: "p".into(),
            setting: Some(on),
            by: "ops".into()
        }]
    );
    for e in &events {
        t.evolve(e);
    }
    assert_eq!(t.threads.get("p"), Some(&on));
    // The same switch again changes nothing, so records nothing.
    let again = C::SetThreads {
        project_id: "p".into(),
        setting: Some(on),
        by: "ops".into(),
    };
    assert_eq!(t.decide(again).unwrap(), vec![]);
    // Off removes it.
    for e in t
        .decide(C::SetThreads {
            project_id: "p".into(),
            setting: None,
            by: "ops".into(),
        })
        .unwrap()
    {
        t.evolve(&e);
    }
    assert!(t.threads.is_empty());

    // No retention is no switch; an unknown project is not found.
    let forever = t
        .decide(C::SetMemory {
            project_id: "p".into(),
            setting: Some(MemorySetting { retain_hours: 0 }),
            by: "ops".into(),
        })
        .unwrap_err();
    assert_eq!(forever.code, RejectionCode::Invalid);
    assert!(forever.reason.contains("retention"), "{}", forever.reason);
    let nowhere = t
        .decide(C::SetMemory {
            project_id: "nope".into(),
            setting: Some(MemorySetting { retain_hours: 1 }),
            by: "ops".into(),
        })
        .unwrap_err();
    assert_eq!(nowhere.code, RejectionCode::NotFound);
}
