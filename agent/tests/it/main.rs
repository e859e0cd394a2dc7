//! Discovery on captured command output and fixture sysfs trees, with the
//! cases of the original agent's tests.

#![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

use std::collections::BTreeMap;
use std::path::Path;

use llmgw_agent::discovery::fabric::{DoubleMembership, check};
use llmgw_agent::discovery::gpu::{Gpu, Health, class, classes};
use llmgw_agent::discovery::ib::{
    self, Hca, Port, parse_enumerated_state, parse_gid_prefix, parse_maybe_hex, parse_rate,
};
use llmgw_agent::discovery::{memory, smi};

mod discovery_table;
mod engines;
mod fetch;
mod probe;
mod provision;
mod session;
mod session_gpus;
mod supervisor;
mod supervisor_table;

pub(crate) const SMI_SAMPLE: &str = "0, GPU-11111111-2222-3333-4444-555555555555, NVIDIA H100 80GB HBM3, 81559, 4, 9.0, 00000000:1B:00.0, 550.54.15, 34, 0
1, GPU-66666666-7777-8888-9999-000000000000, NVIDIA H100 80GB HBM3, 81559, 0, 9.0, 00000000:1C:00.0, 550.54.15, 36, 0
";

#[test]
fn nvidia_smi_rows_parse_into_healthy_gpus() {
    let gpus = smi::parse(SMI_SAMPLE).unwrap();
    assert_eq!(gpus.len(), 2);
    let g = &gpus[0];
    assert_eq!(g.uuid, "GPU-11111111-2222-3333-4444-555555555555");
    assert_eq!(
        (
            g.memory_total_mb,
            g.compute_capability.as_str(),
            g.driver_version.as_str()
        ),
        (81559, "9.0", "550.54.15")
    );
    assert_eq!(
        (g.class.as_str(), g.numa_node, g.health.temperature_c),
        ("h100-80g", -1, 34)
    );
    assert!(g.health.ok(), "4 MiB used is driver overhead");
}

#[test]
fn figures_a_card_lacks_read_as_zero_and_rows_cut_short_are_refused() {
    let row = "0, GPU-abc, NVIDIA GeForce RTX 4090, 24564, 300, 8.9, 00000000:01:00.0, 550.54.15, 40, [N/A]\n\n";
    let gpus = smi::parse(row).unwrap();
    assert_eq!(gpus.len(), 1);
    assert_eq!(
        (gpus[0].health.ecc_errors, gpus[0].class.as_str()),
        (0, "4090-24g")
    );
    assert!(gpus[0].health.ok());
    for (cell, want) in [
        (" 81559 MiB ", 81559),
        ("250 W", 250),
        ("[N/A]", 0),
        ("Not Supported", 0),
        ("", 0),
        ("abc", 0),
    ] {
        assert_eq!(smi::parse_csv_int(cell), want, "{cell:?}");
    }
    assert!(smi::parse("0, \"unterminated, x\n").is_err());
    // A card's row with fields missing, or a row whose index is no
    // number with no card's row beside it: not the CSV asked for.
    assert!(smi::parse(&format!("{row}1, GPU-short, NVIDIA H100\n")).is_err());
    assert!(
        smi::parse("x, GPU-noindex, NVIDIA H100 80GB HBM3, 81559, 0, 9.0, 0:0, 550, 30, 0\n")
            .is_err()
    );
}

#[test]
fn an_older_driver_without_utilisation_still_discovers_and_a_newer_reports_it() {
    let old = "0, GPU-aaa, NVIDIA H100 80GB HBM3, 81559, 1024, 9.0, 0000:01:00.0, 550.54, 41, 0";
    let g = &smi::parse(old).unwrap()[0];
    assert_eq!(
        (
            g.memory_total_mb,
            g.health.temperature_c,
            g.utilization_percent
        ),
        (81559, 41, 0)
    );
    let new = format!("{old}, 87");
    assert_eq!(smi::parse(&new).unwrap()[0].utilization_percent, 87);
}

#[test]
fn foreign_memory_and_ecc_errors_keep_a_gpu_out() {
    let used = Gpu {
        name: "NVIDIA H100 80GB HBM3".into(),
        memory_total_mb: 81559,
        memory_used_mb: 40000,
        ..Gpu::default()
    }
    .finish();
    assert_eq!(
        used.health.problems,
        vec!["40000 MiB already allocated by another process"]
    );
    let ecc = Gpu {
        memory_used_mb: 512,
        health: Health {
            ecc_errors: 3,
            ..Health::default()
        },
        ..Gpu::default()
    }
    .finish();
    assert_eq!(
        ecc.health.problems,
        vec!["3 uncorrected ECC errors"],
        "512 MiB is still overhead"
    );
}

#[test]
fn gpu_classes_are_name_and_reported_memory() {
    for (name, mib, want) in [
        ("NVIDIA H100 80GB HBM3", 81559, "h100-80g"),
        ("NVIDIA H100-SXM5-80GB", 81559, "h100-80g"),
        ("Tesla A100-SXM4-40GB", 40960, "a100-40g"),
        ("NVIDIA A100 80GB PCIe", 81920, "a100-80g"),
        ("NVIDIA L40S", 46068, "l40s-45g"),
        ("NVIDIA GeForce RTX 4090", 24564, "4090-24g"),
        ("Tesla V100-SXM2-16GB", 16160, "v100-16g"),
        ("Mystery Card", 8192, "mystery-card-8g"),
    ] {
        assert_eq!(class(name, mib), want, "{name}");
    }
    let inv: Vec<Gpu> = [
        ("NVIDIA H100 80GB HBM3", 81559),
        ("NVIDIA H100-SXM5-80GB", 81559),
        ("Tesla A100-SXM4-40GB", 40960),
    ]
    .into_iter()
    .map(|(n, m)| {
        Gpu {
            name: n.into(),
            memory_total_mb: m,
            ..Gpu::default()
        }
        .finish()
    })
    .collect();
    assert_eq!(classes(&inv), vec!["a100-40g", "h100-80g"]);
}

#[test]
fn nvidia_smi_runs_as_a_command_and_a_missing_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let stub = executable(
        dir.path(),
        "nvidia-smi",
        &format!("cat <<'EOF'\n{SMI_SAMPLE}EOF\n"),
    );
    assert_eq!(smi::discover(Some(&stub)).unwrap().len(), 2);
    let err = smi::discover(Some(&dir.path().join("absent"))).unwrap_err();
    assert!(err.to_string().starts_with("running "), "{err}");
    let failing = executable(
        dir.path(),
        "failing",
        "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n",
    );
    let err = smi::discover(Some(&failing)).unwrap_err();
    assert!(err.to_string().contains("NVIDIA-SMI has failed"), "{err}");
}

/// nvidia-smi says why it failed on stdout, with stderr empty (the
/// driver not loaded yet, at boot): the error carries it, where it said
/// only "exit status: 9:" and nothing after.
#[test]
fn a_failing_nvidia_smi_says_why_from_its_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let why = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.";
    let failing = executable(
        dir.path(),
        "nvidia-smi",
        &format!("cat <<'EOF'\n{why}\n\nEOF\nexit 9\n"),
    );
    let err = smi::discover(Some(&failing)).unwrap_err().to_string();
    assert!(err.ends_with(&format!("exit status: 9: {why}")), "{err}");
    // stderr, when it says anything, is what it says.
    let both = executable(
        dir.path(),
        "both",
        "echo 'rows so far'\necho 'Failed to initialize NVML' >&2\nexit 9\n",
    );
    let err = smi::discover(Some(&both)).unwrap_err().to_string();
    assert!(err.ends_with(": Failed to initialize NVML"), "{err}");
    let silent = executable(dir.path(), "silent", "exit 9\n");
    let err = smi::discover(Some(&silent)).unwrap_err().to_string();
    assert!(err.ends_with("exit status: 9: it printed nothing"), "{err}");
    // A flood is cut: the text goes into each card's problem and the log.
    let flood = executable(
        dir.path(),
        "flood",
        "i=0; while [ $i -lt 200 ]; do echo \"line $i of a driver dump\"; i=$((i+1)); done\nexit 9\n",
    );
    let err = smi::discover(Some(&flood)).unwrap_err().to_string();
    assert!(
        err.contains(": line 0 of a driver dump; line 1 of") && err.ends_with('…'),
        "{err}"
    );
    assert!(err.chars().count() < 400, "{} chars", err.chars().count());
}

/// A shell script at `dir/name`, executable.
///
/// Written by a `sh` child and renamed into place: a process running the
/// old one never meets a file half written, and no file descriptor open
/// for writing ever exists in this process. (Tests run in threads: one
/// that forks while another holds the script open for writing gives the
/// child a copy of that descriptor until it execs, and running the script
/// meanwhile fails with ETXTBSY, "Text file busy".)
pub(crate) fn executable(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut sh = std::process::Command::new("sh")
        .args([
            "-c",
            r#"cat > "$1" && chmod 755 "$1" && mv "$1" "$2""#,
            "sh",
        ])
        .arg(&tmp)
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    sh.stdin
        .take()
        .unwrap()
        .write_all(format!("#!/bin/sh\n{body}").as_bytes())
        .unwrap();
    assert!(sh.wait().unwrap().success(), "writing {}", path.display());
    path
}

pub(crate) fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The original tests' sysfs tree: mlx5_0 (IB, 200, with a PCI device),
/// mlx5_1 (one port up, one down), mlx5_2 (RoCE at 100).
pub(crate) fn fake_sysfs(root: &Path) {
    let ib = root.join("class/infiniband");
    let port = |hca: &str, n: u32, state: &str, phys: &str, rate: &str, layer: &str| {
        let p = ib.join(hca).join("ports").join(n.to_string());
        write(&p.join("state"), state);
        write(&p.join("phys_state"), phys);
        write(&p.join("rate"), rate);
        write(&p.join("link_layer"), layer);
        p
    };
    write(&ib.join("mlx5_0/fw_ver"), "20.35.1012\n");
    let p = port(
        "mlx5_0",
        1,
        "4: ACTIVE",
        "5: LinkUp",
        "200 Gb/sec (4X HDR)",
        "InfiniBand",
    );
    write(&p.join("gids/0"), "FEC0:0000:0000:000A:0002:C903:00A0:1234");
    write(&p.join("lid"), "0x1a");
    write(&p.join("sm_lid"), "1");
    let pci = root.join("devices/pci/0000:0b:00.0");
    write(&pci.join("numa_node"), "1\n");
    std::os::unix::fs::symlink(&pci, ib.join("mlx5_0/device")).unwrap();
    port(
        "mlx5_1",
        1,
        "4: ACTIVE",
        "5: LinkUp",
        "200 Gb/sec (4X HDR)",
        "InfiniBand",
    );
    port("mlx5_1", 2, "1: DOWN", "3: Disabled", "0", "InfiniBand");
    port(
        "mlx5_2",
        1,
        "4: ACTIVE",
        "5: LinkUp",
        "100 Gb/sec (4X EDR)",
        "Ethernet",
    );
}

#[test]
fn infiniband_adapters_are_read_from_sysfs() {
    let dir = tempfile::tempdir().unwrap();
    fake_sysfs(dir.path());
    // An adapter without ports/ is skipped, not fatal.
    std::fs::create_dir_all(dir.path().join("class/infiniband/mlx5_broken")).unwrap();
    let hcas = ib::discover(Some(&dir.path().join("class/infiniband"))).unwrap();
    assert_eq!(
        hcas.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        vec!["mlx5_0", "mlx5_1", "mlx5_2"]
    );
    let h = &hcas[0];
    assert_eq!(
        (
            h.firmware_version.as_str(),
            h.pci_addr.as_str(),
            h.numa_node
        ),
        ("20.35.1012", "0000:0b:00.0", 1)
    );
    let p = &h.ports[0];
    assert_eq!(
        (
            p.state.as_str(),
            p.phys_state.as_str(),
            p.rate_gbps,
            p.link_layer.as_str(),
            p.gid_prefix.as_str(),
            p.lid,
            p.sm_lid
        ),
        (
            "ACTIVE",
            "LinkUp",
            200,
            "InfiniBand",
            "fec0:0000:0000:000a",
            26,
            1
        )
    );
    assert_eq!(
        (
            hcas[1].ports.len(),
            hcas[1]
                .active_ports()
                .iter()
                .map(|p| p.num)
                .collect::<Vec<_>>()
        ),
        (2, vec![1])
    );
    assert_eq!(
        hcas[2].ports[0].link_layer, "Ethernet",
        "RoCE is told apart"
    );
    assert!(
        ib::discover(Some(&dir.path().join("absent")))
            .unwrap()
            .is_empty(),
        "no fabric is not an error"
    );
}

#[test]
fn the_sysfs_value_parsers_match_the_original_cases() {
    for (s, want) in [
        ("4: ACTIVE", "ACTIVE"),
        ("1: DOWN", "DOWN"),
        ("5: LinkUp", "LinkUp"),
        ("ACTIVE", "ACTIVE"),
        ("", ""),
    ] {
        assert_eq!(parse_enumerated_state(s), want);
    }
    for (s, want) in [
        ("200 Gb/sec (4X HDR)", 200),
        ("100 Gb/sec (4X EDR)", 100),
        ("2.5 Gb/sec (1X SDR)", 2),
        ("", 0),
        ("garbage", 0),
    ] {
        assert_eq!(parse_rate(s), want, "{s:?}");
    }
    for (s, want) in [("0x1a", 26), ("0X1A", 26), ("26", 26), ("", 0), ("zzz", 0)] {
        assert_eq!(parse_maybe_hex(s), want, "{s:?}");
    }
    for (s, want) in [
        (
            "FE80:0000:0000:0000:0002:C903:00A0:1234",
            "fe80:0000:0000:0000",
        ),
        ("short:gid", ""),
        ("fec0::1", ""),
    ] {
        assert_eq!(parse_gid_prefix(s), want, "{s:?}");
    }
}

fn hca(name: &str, ports: &[(&str, &str, u32)]) -> Hca {
    Hca {
        name: name.into(),
        ports: ports
            .iter()
            .enumerate()
            .map(|(i, (state, phys, rate))| Port {
                num: i as u32 + 1,
                state: (*state).into(),
                phys_state: (*phys).into(),
                rate_gbps: *rate,
                ..Port::default()
            })
            .collect(),
        numa_node: -1,
        ..Hca::default()
    }
}

fn declared(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(f, h)| (f.to_string(), h.iter().map(|s| s.to_string()).collect()))
        .collect()
}

#[test]
fn fabric_checks_name_missing_and_inactive_adapters_and_take_the_slowest_link() {
    let up = hca("mlx5_0", &[("ACTIVE", "LinkUp", 200)]);
    let c = &check(
        &declared(&[("ib-a", &["mlx5_0", "mlx5_9"])]),
        std::slice::from_ref(&up),
    )
    .unwrap()[0];
    assert_eq!(c.usable, vec!["mlx5_0"]);
    assert_eq!(
        c.problems,
        vec!["mlx5_9 is not on this node (found: mlx5_0)"]
    );

    let init = hca("mlx5_0", &[("INIT", "LinkUp", 200)]);
    let c = &check(&declared(&[("ib-a", &["mlx5_0"])]), &[init]).unwrap()[0];
    assert!(
        !c.ok() && c.problems[0].contains("INIT"),
        "{:?}",
        c.problems
    );

    let fast = hca("mlx5_0", &[("ACTIVE", "LinkUp", 400)]);
    let slow = hca("mlx5_1", &[("ACTIVE", "LinkUp", 100)]);
    assert_eq!(
        check(&declared(&[("ib-a", &["mlx5_0", "mlx5_1"])]), &[fast, slow]).unwrap()[0].rate_gbps,
        100
    );

    let mixed = hca(
        "mlx5_0",
        &[("DOWN", "Disabled", 0), ("ACTIVE", "LinkUp", 200)],
    );
    let c = &check(&declared(&[("ib-a", &["mlx5_0"])]), &[mixed]).unwrap()[0];
    assert!(c.ok() && c.rate_gbps == 200);

    let down = hca("mlx5_0", &[("DOWN", "Polling", 0)]);
    assert!(!check(&declared(&[("ib-a", &["mlx5_0"])]), &[down]).unwrap()[0].ok());
    assert!(check(&BTreeMap::new(), &[]).unwrap().is_empty());

    let order: Vec<String> = check(
        &declared(&[("ib-c", &["x"]), ("ib-a", &["y"]), ("ib-b", &["z"])]),
        &[],
    )
    .unwrap()
    .into_iter()
    .map(|c| c.fabric)
    .collect();
    assert_eq!(order, vec!["ib-a", "ib-b", "ib-c"]);
    let c = &check(&declared(&[("ib-a", &["mlx5_7"])]), &[]).unwrap()[0];
    assert_eq!(c.problems, vec!["mlx5_7 is not on this node (found: none)"]);
}

/// `agent run` dropped a fabric whose adapters are not on the node without
/// a word (only `agent inventory` said it): what registration leaves out
/// is said in the inventory's words, and a fabric in order is not.
#[test]
fn fabrics_a_registration_leaves_out_are_said_in_the_inventorys_words() {
    use llmgw_agent::discovery::fabric::left_out;
    let up = hca("mlx5_0", &[("ACTIVE", "LinkUp", 200)]);
    let checks = check(
        &declared(&[("ib-a", &["mlx5_7"]), ("ib-b", &["mlx5_0", "mlx5_9"])]),
        std::slice::from_ref(&up),
    )
    .unwrap();
    assert_eq!(
        checks[0].describe(),
        "NOT USABLE; mlx5_7 is not on this node (found: mlx5_0)"
    );
    assert_eq!(
        left_out(&checks),
        [
            "fabric ib-a: NOT USABLE; mlx5_7 is not on this node (found: mlx5_0); not registered: no replica that needs it is placed on this node",
            "fabric ib-b: ok at 200 Gb/s; mlx5_9 is not on this node (found: mlx5_0); registered with mlx5_0 only",
        ]
    );
    let fine = check(&declared(&[("ib-a", &["mlx5_0"])]), &[up]).unwrap();
    assert_eq!(fine[0].describe(), "ok at 200 Gb/s");
    assert!(left_out(&fine).is_empty());
}

#[test]
fn an_adapter_named_under_two_fabrics_is_refused() {
    let err = check(
        &declared(&[("ib-a", &["mlx5_0"]), ("ib-b", &["mlx5_0"])]),
        &[],
    )
    .unwrap_err();
    assert_eq!(
        err,
        DoubleMembership {
            hca: "mlx5_0".into(),
            first: "ib-a".into(),
            second: "ib-b".into()
        }
    );
}

#[test]
fn total_memory_comes_from_meminfo_and_unreadable_means_unknown() {
    assert_eq!(
        memory::parse("MemFree: 1 kB\nMemTotal:       32876244 kB\nSwapTotal: 0 kB\n"),
        32105
    );
    for bad in [
        "",
        "MemTotal:\n",
        "MemTotal: not-a-number kB",
        "Other: 1 kB",
    ] {
        assert_eq!(memory::parse(bad), 0, "{bad:?}");
    }
    assert_eq!(memory::total_mb(Path::new("/nonexistent/meminfo")), 0);
}

#[test]
fn a_gpu_serialises_in_the_inventory_shape() {
    let g = &smi::parse(SMI_SAMPLE).unwrap()[0];
    let v = serde_json::to_value(g).unwrap();
    assert_eq!(
        (v["class"].as_str(), v["memory_total_mb"].as_u64()),
        (Some("h100-80g"), Some(81559))
    );
    assert!(v.get("utilization_percent").is_none(), "omitted when 0");
    assert!(
        v.get("nvlink_peers").is_none() && v.get("cuda_version").is_none(),
        "omitted when empty"
    );
}

#[test]
fn the_host_is_read_from_os_release_cpuinfo_and_the_driver() {
    use llmgw_agent::discovery::host::{
        Host, debian_arch, parse_cpu_flags, parse_driver_version, parse_os_release,
    };
    let h = parse_os_release(
        "NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"24.04\"\nVERSION_CODENAME=noble\nnot a pair\n",
    );
    assert_eq!(
        (
            h.os_id.as_str(),
            h.os_version.as_str(),
            h.os_codename.as_str(),
            h.os_like.clone()
        ),
        ("ubuntu", "24.04", "noble", vec!["debian".to_string()])
    );
    assert_eq!(h.family(), "deb");
    assert_eq!(
        Host {
            os_id: "rocky".into(),
            ..Host::default()
        }
        .family(),
        "rpm"
    );
    assert_eq!(
        Host {
            os_id: "arch".into(),
            ..Host::default()
        }
        .family(),
        ""
    );
    assert_eq!(
        (
            debian_arch("x86_64"),
            debian_arch("aarch64"),
            debian_arch("riscv64")
        ),
        ("amd64", "arm64", "riscv64")
    );
    let cpu = "processor\t: 0\nflags\t\t: fpu sse avx2 avx fma avx512f amx_tile\nflags : sve\n";
    assert_eq!(
        parse_cpu_flags(cpu),
        vec!["avx", "avx2", "fma", "avx512f", "amx_tile"],
        "fixed order, first line only"
    );
    assert_eq!(
        parse_cpu_flags("Features\t: fp asimd sve\n"),
        vec!["asimd", "sve"]
    );
    assert!(parse_cpu_flags("").is_empty());
    assert_eq!(
        parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Fri Jan 24 2025\n"
        ),
        "570.86.15"
    );
    assert_eq!(
        parse_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n"
        ),
        "570.86.15",
        "the open module's banner reads right"
    );
    assert_eq!(parse_driver_version(""), "");
}

#[test]
fn weights_are_files_and_directories_with_weight_files() {
    use llmgw_agent::discovery::weights::scan;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("qwen-3b-q4.gguf"), vec![0u8; 1024]).unwrap();
    std::fs::create_dir(d.join("Llama-3.3-70B")).unwrap();
    std::fs::write(
        d.join("Llama-3.3-70B/model-00001.safetensors"),
        vec![0u8; 2048],
    )
    .unwrap();
    std::fs::write(d.join("Llama-3.3-70B/config.json"), vec![0u8; 64]).unwrap();
    std::fs::create_dir(d.join("downloading")).unwrap();
    std::fs::write(d.join("downloading/README.md"), "partial").unwrap();
    std::fs::write(d.join("notes.txt"), "x").unwrap();
    std::fs::write(d.join("fetch.sh"), "x").unwrap();
    let found = scan(&[
        d.to_path_buf(),
        d.to_path_buf(),
        "".into(),
        d.join("absent"),
    ]);
    let got: Vec<(String, u64)> = found
        .iter()
        .map(|w| (w.path.rsplit('/').next().unwrap().to_owned(), w.size_bytes))
        .collect();
    assert_eq!(
        got,
        vec![
            ("Llama-3.3-70B".into(), 2112),
            ("qwen-3b-q4.gguf".into(), 1024)
        ]
    );
    assert!(found.iter().all(|w| !w.shared));
    assert!(scan(&[]).is_empty());
}

#[test]
fn storage_is_counted_once_per_disk_and_missing_mounts_are_unknown() {
    use llmgw_agent::discovery::storage::{is_network_fs, scan};
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let found = scan(&[a.clone(), b, "".into(), dir.path().join("absent")]);
    assert_eq!(
        found.len(),
        1,
        "two directories on one disk are one pool of bytes"
    );
    assert_eq!(found[0].path, a.display().to_string());
    assert!(found[0].total_bytes > 0 && found[0].free_bytes <= found[0].total_bytes);
    assert!(
        !found[0].shared,
        "local storage is never mistaken for shared"
    );
    assert!(scan(&[]).is_empty());
    assert!(is_network_fs(0x6969) && is_network_fs(0xFF53_4D42) && !is_network_fs(0xEF53));
}

#[test]
fn nvlink_peers_are_gpu_indices_of_this_machine_only() {
    use llmgw_agent::discovery::nvml::peer_indices;
    // Four cards: 0-1 and 2-3 bridged pairwise, 0 also reaches a switch
    // (a bus id that is no card here), 1 reaches 0 over two links.
    let links = vec![
        (
            "00000000:1B:00.0".to_string(),
            vec![
                "00000000:1C:00.0".to_string(),
                "00000000:FF:00.0".to_string(),
            ],
        ),
        (
            "00000000:1C:00.0".to_string(),
            vec!["00000000:1b:00.0".to_string(), "0000:1B:00.0".to_string()],
        ),
        (
            "00000000:3D:00.0".to_string(),
            vec!["00000000:3E:00.0".to_string()],
        ),
        (
            "00000000:3E:00.0".to_string(),
            vec!["00000000:3D:00.0".to_string()],
        ),
    ];
    assert_eq!(
        peer_indices(&links),
        vec![vec![1], vec![0], vec![3], vec![2]]
    );
    assert_eq!(
        peer_indices(&[("a".to_string(), vec![])]),
        vec![Vec::<u32>::new()]
    );
}
