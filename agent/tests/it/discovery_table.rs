//! The rows of the original agent's discovery tests
//! (`shared/reference/agent-discovery.md`) that need the whole `discover`
//! pass or the small tables around it, on fixture trees and stub commands.

use std::path::{Path, PathBuf};

use llmgw_agent::discovery::{Options, discover, host, nvml, storage, weights};

use super::{SMI_SAMPLE, executable, fake_sysfs, write};

/// An nvidia-smi that prints the original tests' two H100s.
fn sample_smi(dir: &Path) -> PathBuf {
    executable(
        dir,
        "nvidia-smi",
        &format!("cat <<'EOF'\n{SMI_SAMPLE}EOF\n"),
    )
}

/// A machine under `root`: 64 GiB of RAM, Ubuntu, a model directory with
/// one GGUF file.
fn machine(root: &Path) -> PathBuf {
    write(&root.join("proc/meminfo"), "MemTotal:       65536000 kB\n");
    write(
        &root.join("etc/os-release"),
        "ID=ubuntu\nVERSION_ID=\"24.04\"\nVERSION_CODENAME=noble\n",
    );
    let models = root.join("models");
    write(&models.join("m.gguf"), "weights");
    models
}

#[test]
fn discover_asks_nvidia_smi_when_told_and_reads_no_adapters_without_sysfs() {
    let dir = tempfile::tempdir().unwrap();
    let smi = sample_smi(dir.path());
    let (inv, error) = discover(&Options {
        root: dir.path().into(),
        nvidia_smi: Some(smi),
        ..Options::default()
    });
    assert!(error.is_none(), "{error:?}");
    assert_eq!((inv.source.as_str(), inv.gpus.len()), ("nvidia-smi", 2));
    assert!(inv.hcas.is_empty(), "no sysfs tree: no adapters, no error");
}

#[test]
fn skipping_gpus_still_reads_the_adapters() {
    let dir = tempfile::tempdir().unwrap();
    fake_sysfs(&dir.path().join("sys"));
    let (inv, error) = discover(&Options {
        root: dir.path().into(),
        skip_gpus: true,
        ..Options::default()
    });
    assert!(error.is_none(), "{error:?}");
    assert_eq!(
        (inv.source.as_str(), inv.gpus.len(), inv.hcas.len()),
        ("none", 0, 3)
    );
}

#[test]
fn a_failing_gpu_discovery_still_reports_memory_host_weights_and_fabrics() {
    let dir = tempfile::tempdir().unwrap();
    let models = machine(dir.path());
    fake_sysfs(&dir.path().join("sys"));
    let (inv, error) = discover(&Options {
        root: dir.path().into(),
        nvidia_smi: Some("/nonexistent/nvidia-smi".into()),
        model_dirs: vec![models.clone()],
        fabrics: [("ib-a".to_string(), vec!["mlx5_0".to_string()])].into(),
        ..Options::default()
    });
    let error = error.expect("an absent nvidia-smi named explicitly is an error");
    assert!(
        error
            .to_string()
            .starts_with("gpu discovery: running /nonexistent/nvidia-smi: "),
        "{error}"
    );
    assert_eq!(inv.memory_total_mb, 64000);
    assert_eq!(inv.host.os_id, "ubuntu");
    assert_eq!(inv.weights.len(), 1);
    assert_eq!(
        inv.weights[0].path,
        models.join("m.gguf").display().to_string()
    );
    assert_eq!(inv.storage.len(), 1);
    // The adapters are read after the GPUs: a driver not up yet at boot
    // took the node's fabrics away too.
    assert_eq!(inv.hcas.len(), 3);
    assert_eq!(inv.fabrics.len(), 1);
    assert_eq!(inv.fabrics[0].usable, ["mlx5_0"]);
}

#[test]
fn an_unreadable_adapter_tree_is_an_error_that_keeps_the_gpus() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the directory should be: sysfs cannot be listed.
    write(&dir.path().join("sys/class/infiniband"), "");
    let smi = sample_smi(dir.path());
    let (inv, error) = discover(&Options {
        root: dir.path().into(),
        nvidia_smi: Some(smi),
        ..Options::default()
    });
    let error = error.unwrap().to_string();
    assert!(
        error.starts_with("infiniband discovery: reading "),
        "{error}"
    );
    assert_eq!(inv.gpus.len(), 2);
}

#[test]
fn an_inventory_serialises_in_the_shape_the_cli_prints() {
    let dir = tempfile::tempdir().unwrap();
    let smi = executable(
        dir.path(),
        "nvidia-smi",
        "echo '0, GPU-aaa, NVIDIA H100 80GB HBM3, 81559, 0, 9.0, 0000:01:00.0, 550.54, 41, 0'\n",
    );
    let (inv, _) = discover(&Options {
        root: dir.path().into(),
        nvidia_smi: Some(smi),
        ..Options::default()
    });
    let v = serde_json::to_value(&inv).unwrap();
    assert_eq!(v["source"], "nvidia-smi");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 1);
    assert_eq!(v["gpus"][0]["class"], "h100-80g");
    assert_eq!(v["gpus"][0]["memory_total_mb"], 81559);
    let back: llmgw_agent::discovery::Inventory = serde_json::from_value(v).unwrap();
    assert_eq!(back, inv, "what is printed reads back whole");
}

#[test]
fn bus_ids_are_normalised_whatever_spelling_the_driver_used() {
    for (raw, want) in [
        ("00000000:1B:00.0", "1b:00.0"),
        ("0000:1b:00.0", "1b:00.0"),
        ("0001:1b:00.0", "1:1b:00.0"),
        (" 1b:00.0 ", "1b:00.0"),
        (":1b:00.0", "1b:00.0"),
    ] {
        assert_eq!(nvml::normalize_bus_id(raw), want, "{raw:?}");
    }
    // Peers keep the order their links were read in.
    let links = vec![
        (
            "0000:01:00.0".to_string(),
            vec!["0000:03:00.0".to_string(), "00000000:02:00.0".to_string()],
        ),
        ("0000:02:00.0".to_string(), vec![]),
        ("0000:03:00.0".to_string(), vec![]),
    ];
    assert_eq!(nvml::peer_indices(&links)[0], vec![2, 1]);
}

#[test]
fn every_shared_filesystem_is_known_by_its_magic_number() {
    for (magic, what) in [
        (0x6969, "NFS"),
        (0x0BD0_0BD0, "Lustre"),
        (0x4750_4653, "GPFS"),
        (0x00C3_6400, "CephFS"),
        (0x6573_5546, "FUSE"),
        (0xFF53_4D42, "SMB"),
    ] {
        assert!(storage::is_network_fs(magic), "{what}");
    }
    for local in [0xEF53, 0x5846_5342, 0x0102_1994, 0] {
        assert!(!storage::is_network_fs(local), "{local:#x}");
    }
}

#[test]
fn an_absent_or_empty_directory_constrains_and_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent");
    assert!(storage::scan(std::slice::from_ref(&absent)).is_empty());
    assert!(storage::scan(&["".into()]).is_empty());
    assert!(weights::scan(&[absent]).is_empty());
    assert!(weights::scan(&["".into()]).is_empty());
    let models = dir.path().join("models");
    write(&models.join("downloading/README.md"), "soon");
    assert!(
        weights::scan(std::slice::from_ref(&models)).is_empty(),
        "README only"
    );
    write(&models.join("notes.txt"), "x");
    write(&models.join("fetch.sh"), "x");
    write(&models.join("real.gguf"), "x");
    let found = weights::scan(&[models.clone(), models.clone()]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].path.ends_with("real.gguf"));
}

#[test]
fn package_families_follow_the_os_or_what_it_is_like() {
    let family = |id: &str, like: &[&str]| {
        host::Host {
            os_id: id.into(),
            os_like: like.iter().map(|s| (*s).to_owned()).collect(),
            ..host::Host::default()
        }
        .family()
    };
    for id in ["debian", "ubuntu"] {
        assert_eq!(family(id, &[]), "deb", "{id}");
    }
    for id in [
        "rhel",
        "fedora",
        "centos",
        "rocky",
        "almalinux",
        "suse",
        "opensuse",
    ] {
        assert_eq!(family(id, &[]), "rpm", "{id}");
    }
    assert_eq!(family("pop", &["ubuntu", "debian"]), "deb");
    assert_eq!(family("ol", &["fedora"]), "rpm");
    assert_eq!(family("arch", &[]), "");
    assert_eq!(host::debian_arch("x86"), "i386");
    assert_eq!(host::debian_arch("arm"), "armhf");
    let h = host::parse_os_release("ID='debian'\nVERSION_ID='12'\n");
    assert_eq!((h.os_id.as_str(), h.os_version.as_str()), ("debian", "12"));
    assert_eq!(host::discover(Path::new("/nonexistent")).os_id, "");
}

#[test]
fn memory_our_own_engine_holds_is_not_another_process() {
    let smi = llmgw_agent::discovery::smi::parse(
        "0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 70000, 9.0, 00000000:1B:00.0, 550.54, 30, 2\n",
    )
    .unwrap();
    let g = &smi[0];
    assert_eq!(
        g.problems_given(false),
        [
            "2 uncorrected ECC errors",
            "70000 MiB already allocated by another process"
        ]
    );
    assert_eq!(
        g.problems_given(true),
        ["2 uncorrected ECC errors"],
        "the memory of an engine of ours (adopted, say) is not a foreign process"
    );
    let mut blind = g.clone();
    blind.health.unreadable = vec!["memory unreadable: Unknown Error".into()];
    assert!(
        blind
            .problems_given(true)
            .contains(&"memory unreadable: Unknown Error".to_owned()),
        "a card the driver cannot read stays out"
    );
}

/// A real H200's row, as nvidia-smi 580.159.04 printed it on a machine
/// with one (2026-12-04; `scripts/gpu-check`, docs/hardware.md): the
/// driver's 143,771 MiB make it `h200-140g`, the class NVML gave it too.
#[test]
fn a_real_h200_row_reads_as_its_class() {
    let gpus = llmgw_agent::discovery::smi::parse(
        "0, GPU-e5d5e115-203e-795a-bc7e-9386792b2883, NVIDIA H200, 143771, 0, 9.0, 00000000:00:06.0, 580.159.04, 39, 0, 0\n",
    )
    .unwrap();
    let g = &gpus[0];
    assert_eq!(g.class, "h200-140g");
    assert_eq!(g.compute_capability, "9.0");
    assert_eq!(nvml::normalize_bus_id(&g.pci_bus_id), "00:06.0");
    assert!(g.health.ok(), "{:?}", g.health);
}

/// The weights cache's filesystem is listed first, named by the cache,
/// whatever the order of the directories: the control plane checks
/// `min_disk_gb` against the first (it summed every disk, so a 24 GB cache
/// beside 79 GB on / read as 104). A cache not made yet is measured where
/// it would be made, and is not made.
#[test]
fn the_weights_caches_disk_is_listed_first_and_is_the_room_for_weights() {
    let dir = tempfile::tempdir().unwrap();
    let models = machine(dir.path());
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let (inv, error) = discover(&Options {
        root: dir.path().into(),
        skip_gpus: true,
        model_dirs: vec![models.clone(), cache.clone()],
        cache_dir: Some(cache.clone()),
        ..Options::default()
    });
    assert!(error.is_none(), "{error:?}");
    assert_eq!(inv.storage.len(), 1, "one disk: {:?}", inv.storage);
    assert_eq!(inv.storage[0].path, cache.display().to_string());
    let later = dir.path().join("not/yet/cache");
    let found = storage::scan_cache_first(Some(&later), std::slice::from_ref(&models));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].path, later.display().to_string());
    assert!(found[0].total_bytes > 0);
    assert!(!later.exists(), "measuring makes nothing");
    // The figure the control plane uses: the first filesystem's.
    let disk = |path: &str, free_gb: u64, shared: bool| storage::Storage {
        path: path.into(),
        free_bytes: free_gb * 1_000_000_000 + 5,
        total_bytes: 1 << 40,
        shared,
    };
    assert_eq!(
        storage::weights_free_gb(&[disk("/cache", 24, false), disk("/", 79, false)]),
        Some(24)
    );
    assert_eq!(
        storage::weights_free_gb(&[disk("/nfs/cache", 500, true), disk("/", 79, false)]),
        None,
        "a shared filer's room is not the node's own"
    );
    assert_eq!(storage::weights_free_gb(&[]), None);
}
