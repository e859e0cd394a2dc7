use llmgw_domain::RejectionCode;
use llmgw_domain::catalog::{
    Catalog, CatalogCommand, CatalogEvent, Engine, Model, Profile, Scaling,
};

pub(crate) fn gpu_profile(name: &str, tp: u32, nodes: u32, gpus_per_node: u32) -> Profile {
    Profile {
        name: name.into(),
        engine: Engine::Vllm,
        gpu_class: Some("h100-80g".into()),
        tp,
        pp: 1,
        nodes,
        gpus_per_node,
        priority: 0,
        weight: 1,
        startup_timeout_s: None,
        min_disk_gb: 100,
        memory_mb: 0,
        node_selector: Default::default(),
        args: vec![],
        env: Default::default(),
    }
}

fn with(models: Vec<Model>) -> Catalog {
    let mut c = Catalog::default();
    for m in models {
        let events = c.decide(CatalogCommand::AddModel(m)).expect("valid model");
        for e in &events {
            c.evolve(e);
        }
    }
    c
}

fn model(name: &str) -> Model {
    let mut m = Model::named(name);
    m.profiles.push(gpu_profile("h100x2", 2, 1, 2));
    m
}

fn reason(c: &Catalog, cmd: CatalogCommand) -> String {
    let before = c.clone();
    let r = c.decide(cmd).expect_err("must be rejected");
    assert_eq!(*c, before);
    r.reason
}

#[test]
fn gpu_arithmetic_must_add_up() {
    let c = Catalog::default();
    let mut m = model("llama-70b");
    m.profiles[0] = gpu_profile("bad", 8, 2, 2);
    let why = reason(&c, CatalogCommand::AddModel(m));
    assert!(
        why.contains("nodes × gpus_per_node = 2 × 2 = 4, but tp × pp = 8 × 1 = 8"),
        "{why}"
    );
    let mut ok = model("llama-70b");
    ok.profiles[0] = gpu_profile("2x4", 8, 2, 4);
    assert_eq!(c.decide(CatalogCommand::AddModel(ok)).unwrap().len(), 1);
}

#[test]
fn cpu_profiles_only_for_engines_that_serve_on_a_cpu() {
    let c = Catalog::default();
    let mut m = model("tiny");
    m.profiles[0].gpu_class = None;
    m.profiles[0].gpus_per_node = 0;
    m.profiles[0].tp = 1;
    let why = reason(&c, CatalogCommand::AddModel(m.clone()));
    assert!(why.contains("vllm cannot serve on a CPU"), "{why}");
    m.profiles[0].engine = Engine::Llamacpp;
    assert!(c.decide(CatalogCommand::AddModel(m.clone())).is_ok());

    // What the agent refused at every placement, for ever, is refused
    // when the model is given.
    let mut split = m.clone();
    split.profiles[0].pp = 3;
    let why = reason(&c, CatalogCommand::AddModel(split));
    assert!(
        why.contains("runs on one node in one stage: pp 3 and nodes 1"),
        "{why}"
    );
    let mut tp = m.clone();
    tp.profiles[0].tp = 2;
    let why = reason(&c, CatalogCommand::AddModel(tp.clone()));
    assert!(
        why.contains("llamacpp runs on one node without tensor parallelism"),
        "{why}"
    );
    tp.profiles[0].engine = Engine::Sim;
    let why = reason(&c, CatalogCommand::AddModel(tp.clone()));
    assert!(
        why.contains("the sim engine splits nothing on a CPU"),
        "{why}"
    );
    tp.profiles[0].engine = Engine::Sglang;
    assert!(
        c.decide(CatalogCommand::AddModel(tp)).is_ok(),
        "SGLang's CPU tp"
    );
}

#[test]
fn aliases_are_unique_and_never_another_models_name() {
    let mut a = model("llama-8b");
    a.aliases = vec!["llama".into()];
    let c = with(vec![a, model("qwen-7b")]);
    let mut b = model("mistral-7b");
    b.aliases = vec!["llama".into()];
    assert!(
        reason(&c, CatalogCommand::AddModel(b))
            .contains("alias llama is claimed by both llama-8b and mistral-7b")
    );
    let mut d = model("mistral-7b");
    d.aliases = vec!["qwen-7b".into()];
    assert!(
        reason(&c, CatalogCommand::AddModel(d))
            .contains("alias qwen-7b of mistral-7b is the name of another model")
    );
    let mut e = model("mistral-7b");
    e.aliases = vec!["mistral-7b".into()];
    assert!(
        reason(&c, CatalogCommand::AddModel(e))
            .contains("model mistral-7b names itself as an alias")
    );
    assert_eq!(
        c.resolve("llama").map(|m| m.name.as_str()),
        Some("llama-8b")
    );
}

#[test]
fn fallbacks_resolve_and_form_no_cycle() {
    let mut a = model("a");
    a.aliases = vec!["alpha".into()];
    let mut b = model("b");
    b.fallbacks = vec!["alpha".into()];
    let c = with(vec![a, b]);
    let mut typo = model("c");
    typo.fallbacks = vec!["bb".into()];
    assert!(
        reason(&c, CatalogCommand::AddModel(typo)).contains("fallback bb is not a model or alias")
    );
    let mut a2 = c.models["a"].clone();
    a2.fallbacks = vec!["b".into()];
    let why = reason(&c, CatalogCommand::UpdateModel(a2));
    assert!(why.contains("fallbacks form a cycle: a → b → a"), "{why}");
    // Removing a model that another falls back to would leave a dangling name.
    let why = reason(&c, CatalogCommand::RemoveModel { name: "a".into() });
    assert!(
        why.contains("fallback alpha is not a model or alias"),
        "{why}"
    );
}

#[test]
fn a_mirror_source_names_a_model_a_version_and_a_file() {
    let c = Catalog::default();
    for bad in [
        "mirror:qwen/2026-03",
        "mirror:qwen/2026-03/a/b.gguf",
        "mirror:qwen/../q4.gguf",
        "mirror:qwen//q4.gguf",
        "mirror:.hidden/v/f",
    ] {
        let mut m = model("m");
        m.source = bad.into();
        let why = reason(&c, CatalogCommand::AddModel(m));
        assert!(
            why.contains("mirror:<model>/<version>/<file>"),
            "{bad}: {why}"
        );
    }
    let mut m = model("m");
    m.source = "mirror:qwen2.5-14b/2026-03/q4_k_m.gguf".into();
    assert_eq!(c.decide(CatalogCommand::AddModel(m)).unwrap().len(), 1);
}

/// A checksum is checked on a download only; where nothing is downloaded
/// it is refused, not passed over.
#[test]
fn a_checksum_needs_a_source_that_is_downloaded() {
    let c = Catalog::default();
    let sum = format!("sha256:{}", "a".repeat(64));
    for source in ["Qwen/Qwen2.5-0.5B-Instruct", "/models/q.gguf", "./q.gguf"] {
        let mut m = model("m");
        m.source = source.into();
        m.checksum = Some(sum.clone());
        let why = reason(&c, CatalogCommand::AddModel(m));
        assert!(
            why.contains("checksum applies to a source that is downloaded"),
            "{source}: {why}"
        );
    }
    for source in [
        "https://files.example/q.gguf",
        "hf:Qwen/Qwen2.5/q.gguf",
        "mirror:q/v1/q.gguf",
    ] {
        let mut m = model("m");
        m.source = source.into();
        m.checksum = Some(sum.clone());
        assert_eq!(
            c.decide(CatalogCommand::AddModel(m)).unwrap().len(),
            1,
            "{source}"
        );
    }
}

#[test]
fn scaling_and_sizes_must_be_sane() {
    let c = Catalog::default();
    let mut m = model("m");
    m.scaling = Scaling {
        min: 3,
        max: 1,
        idle_timeout_s: None,
    };
    assert!(reason(&c, CatalogCommand::AddModel(m)).contains("scaling min 3 exceeds max 1"));
    let mut m = model("m");
    m.scaling = Scaling {
        min: 0,
        max: 0,
        idle_timeout_s: None,
    };
    assert!(reason(&c, CatalogCommand::AddModel(m)).contains("scaling max 0 could never serve it"));
    // An idle time where nothing can be idle is refused, not ignored.
    let mut m = model("m");
    m.scaling = Scaling {
        min: 1,
        max: 1,
        idle_timeout_s: Some(60),
    };
    let why = reason(&c, CatalogCommand::AddModel(m.clone()));
    assert!(why.contains("idle_timeout_s 60 would never act"), "{why}");
    for (min, max) in [(0, 1), (1, 2)] {
        m.scaling.min = min;
        m.scaling.max = max;
        assert!(c.decide(CatalogCommand::AddModel(m.clone())).is_ok());
    }
    let mut m = model("m");
    m.context_length = Some(0);
    assert!(reason(&c, CatalogCommand::AddModel(m)).contains("context length 0"));
    let mut m = model("m");
    m.profiles.push(gpu_profile("h100x2", 2, 1, 2));
    assert!(reason(&c, CatalogCommand::AddModel(m)).contains("two profiles share this name"));
}

#[test]
fn edits_are_events_only_when_something_changed() {
    let c = with(vec![model("m")]);
    assert_eq!(
        c.decide(CatalogCommand::UpdateModel(model("m"))).unwrap(),
        vec![]
    );
    let mut edited = model("m");
    edited.profiles[0].args = vec!["--max-model-len=8192".into()];
    let events = c
        .decide(CatalogCommand::UpdateModel(edited.clone()))
        .unwrap();
    assert_eq!(
        events,
        vec![CatalogEvent::ModelUpdated {
            model: edited.clone()
        }]
    );
    // The profile's fingerprint tells the edited profile apart.
    assert_ne!(
        c.models["m"].profiles[0].fingerprint(),
        edited.profiles[0].fingerprint()
    );
    assert_eq!(
        c.models["m"].profiles[0].fingerprint(),
        model("m").profiles[0].fingerprint()
    );
    let r = c.decide(CatalogCommand::AddModel(model("m"))).unwrap_err();
    assert_eq!(r.code, RejectionCode::Conflict);
    let r = c
        .decide(CatalogCommand::RemoveModel { name: "x".into() })
        .unwrap_err();
    assert_eq!(r.code, RejectionCode::NotFound);
}

#[test]
fn a_configuration_file_applies_whole_with_references_in_any_order() {
    let mut big = model("big");
    big.fallbacks = vec!["small".into()];
    let small = model("small");
    let c = Catalog::default();
    let events = c
        .decide(CatalogCommand::ApplyModels(vec![
            big.clone(),
            small.clone(),
        ]))
        .expect("a fallback may name a model further down the file");
    assert_eq!(events.len(), 2);
    let c = with(vec![small.clone(), big.clone()]);
    assert!(
        c.decide(CatalogCommand::ApplyModels(vec![
            big.clone(),
            small.clone()
        ]))
        .unwrap()
        .is_empty(),
        "an unchanged file appends nothing"
    );
    let mut edited = small.clone();
    edited.description = "now described".into();
    let events = c
        .decide(CatalogCommand::ApplyModels(vec![big.clone(), edited]))
        .unwrap();
    assert!(matches!(&events[..], [CatalogEvent::ModelUpdated { model }] if model.name == "small"));
    assert!(
        reason(
            &c,
            CatalogCommand::ApplyModels(vec![small.clone(), small.clone()])
        )
        .contains("listed twice")
    );
    let mut dangling = model("lonely");
    dangling.fallbacks = vec!["nobody".into()];
    assert!(
        reason(
            &Catalog::default(),
            CatalogCommand::ApplyModels(vec![dangling])
        )
        .contains("nobody")
    );
}

#[test]
fn a_routing_profile_is_refused_rather_than_ignored() {
    let mut m = model("chat-8b");
    m.routing_profile = Some("chat".into());
    let why = "routing_profile \"chat\" is not supported";
    let empty = Catalog::default();
    assert!(reason(&empty, CatalogCommand::AddModel(m.clone())).contains(why));
    assert!(reason(&empty, CatalogCommand::ApplyModels(vec![m.clone()])).contains(why));
    let c = with(vec![model("chat-8b")]);
    assert!(reason(&c, CatalogCommand::UpdateModel(m)).contains(why));

    // A catalog whose history holds one still takes other changes, and so
    // does one holding what older versions took and passed over (max 0, a
    // checksum nothing downloads): a leader taking office applies its file
    // to it, and a refusal there would leave no leader.
    let mut old = model("old-8b");
    old.routing_profile = Some("batch".into());
    let mut never = model("never");
    never.scaling = Scaling {
        min: 0,
        max: 0,
        idle_timeout_s: None,
    };
    let mut unchecked = model("unchecked");
    unchecked.source = "Qwen/Qwen2.5-0.5B-Instruct".into();
    unchecked.checksum = Some(format!("sha256:{}", "a".repeat(64)));
    let mut c = Catalog::default();
    for m in [old, never, unchecked] {
        c.evolve(&CatalogEvent::ModelAdded { model: m });
    }
    assert_eq!(
        c.decide(CatalogCommand::AddModel(model("new-8b")))
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        c.decide(CatalogCommand::ApplyModels(vec![model("new-8b")]))
            .unwrap()
            .len(),
        1
    );
}

/// A model's context length is passed to its engine, so a change to it
/// makes running replicas outdated as a profile change does; without one,
/// a replica's fingerprint is its profile's, as before it was passed.
#[test]
fn a_models_context_length_is_part_of_what_its_replicas_run() {
    let mut m = model("m");
    let p = m.profiles[0].clone();
    assert_eq!(m.profile_fp(&p), p.fingerprint());
    m.context_length = Some(8192);
    let long = m.profile_fp(&p);
    assert_ne!(long, p.fingerprint());
    m.context_length = Some(4096);
    assert_ne!(m.profile_fp(&p), long);
    assert_eq!(m.profile_fp(&p).len(), p.fingerprint().len());
}
