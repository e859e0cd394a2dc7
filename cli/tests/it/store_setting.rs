//! The store a server is given is the store it uses, in every mode:
//! `--store` on the command line wins over the file's `store:`, and a
//! router with neither keys nor usage still opens a named store and takes
//! its catalog (aliases, fallbacks, prices) from it.

use llmgw_testkit::{Backend, Scratch};
use serde_json::json;

use super::tenancy::{engine, leads};
use super::{Child, until};

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Postgres).await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Sqlite).await } )* }
    };
}

both_backends!(a_router_without_keys_takes_the_catalog_of_the_store_it_is_given);

/// Answers whether `model` gets a 200 from the gateway at `base`.
async fn served(base: &str, model: &str) -> bool {
    reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

async fn a_router_without_keys_takes_the_catalog_of_the_store_it_is_given(b: Backend) {
    let (address, _scratch) = Scratch::new(b).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let endpoint = format!("endpoints: [\"e1=http://{e}=paid,free\"]\n");

    // A control plane writes the catalog, `cheap` an alias of `free`, into
    // the store.
    let seed = dir.path().join("seed.yaml");
    std::fs::write(
        &seed,
        format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nagent_listen: \"127.0.0.1:0\"\nstore: \"{address}\"\n{endpoint}control:\n  interval: 200ms\nmodels:\n  - name: free\n    aliases: [cheap]\n    scaling: {{min: 0, max: 1}}\n    profiles: [{{name: sim, engine: sim}}]\n"
        ),
    )
    .unwrap();
    let control = Child::spawn(&["server", "--config", seed.to_str().unwrap()]);
    let base = format!("http://{}", control.addr_after("client listening on "));
    leads(&format!(
        "http://{}",
        control.addr_after("admin listening on ")
    ))
    .await;
    until("the catalog's alias to serve", || async {
        served(&base, "cheap").await.then_some(())
    })
    .await;
    drop(control);

    // A router with no keys and no usage, its file naming another store
    // and its command line this one: the command line's store is opened
    // and its catalog routes the alias; the file's is never made.
    let elsewhere = dir.path().join("elsewhere.db");
    let router = dir.path().join("router.yaml");
    std::fs::write(
        &router,
        format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nstore: \"sqlite://{}\"\n{endpoint}",
            elsewhere.display()
        ),
    )
    .unwrap();
    let router = Child::spawn(&[
        "--store",
        &address,
        "server",
        "--config",
        router.to_str().unwrap(),
    ]);
    let base = format!("http://{}", router.addr_after("client listening on "));
    Child::expect(&router.stderr, "views started");
    assert!(served(&base, "free").await, "the static endpoint serves");
    until("the stored catalog's alias to serve", || async {
        served(&base, "cheap").await.then_some(())
    })
    .await;
    assert!(
        !elsewhere.exists(),
        "the file's store was opened although the command line named another"
    );
}
