//! Re-records the incident fixtures from their scripts:
//! `cargo run -p llmgw-replay-tests --bin record-incidents`.
//! Recorded fixtures are history: re-record only on purpose, review the
//! diff, and update the snapshots (`cargo insta review` or INSTA_UPDATE=always).

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let dir = llmgw_replay_tests::fixtures_dir();
    std::fs::create_dir_all(&dir)?;
    rt.block_on(async {
        for name in llmgw_replay_tests::incidents::ALL {
            let log = llmgw_replay_tests::incidents::record_incident(name).await?;
            std::fs::write(dir.join(format!("{name}.jsonl")), log)?;
            println!("recorded {name}");
        }
        let frozen = dir.join("frozen-v1.jsonl");
        if frozen.exists() {
            println!("kept frozen-v1.jsonl: it is the upcasting contract and is never re-recorded");
        } else {
            std::fs::write(
                &frozen,
                llmgw_replay_tests::incidents::record_frozen_v1().await?,
            )?;
            println!("recorded frozen-v1");
        }
        Ok(())
    })
}
