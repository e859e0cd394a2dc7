//! Which build of an engine suits a node: pure, from the version and the
//! host's facts. Only llama.cpp is installed by the agent; vLLM and SGLang
//! are multi-GB Python environments, installed by hand and named in the
//! agent's configuration.

use std::collections::BTreeMap;

use crate::discovery::host::Host;

/// The CUDA build llama.cpp publishes and this agent installs.
pub const LLAMACPP_CUDA: &str = "12.8";

/// One build of an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// `cpu`, `cuda-12.8`: part of the install directory's name.
    pub variant: String,
    /// Archives unpacked in order into one directory.
    pub assets: Vec<String>,
    /// OS packages the build needs, by package family (`deb`, `rpm`).
    pub packages: BTreeMap<&'static str, Vec<&'static str>>,
    /// The executable's file name, looked for anywhere in the build.
    pub binary: String,
    /// CPU features the build is fastest with: reported when missing,
    /// never refused.
    pub cpu_flags: Vec<&'static str>,
}

/// The build of `engine` at `version` for `host`; None for an engine this
/// agent cannot install; an error for a host it has no build for.
pub fn choose(engine: &str, version: &str, host: &Host) -> Option<Result<Build, String>> {
    match engine {
        "llamacpp" => Some(llamacpp(version, host)),
        _ => None,
    }
}

/// llama.cpp's release archives: the CUDA build (with its runtime, so
/// only a driver is needed) on an x64 node with an NVIDIA driver, else
/// the CPU build. The distribution's name is not consulted: `ldd` says
/// whether a build runs.
pub fn llamacpp(v: &str, h: &Host) -> Result<Build, String> {
    let arch = match h.arch.as_str() {
        "amd64" => "x64",
        "arm64" => "arm64",
        "" => return Err("llama.cpp publishes no Linux build for an unrecognised system".into()),
        other => return Err(format!("llama.cpp publishes no Linux build for {other}")),
    };
    let packages = BTreeMap::from([("deb", vec!["libgomp1"]), ("rpm", vec!["libgomp"])]);
    if !h.nvidia_driver.is_empty() && arch == "x64" {
        let c = LLAMACPP_CUDA;
        return Ok(Build {
            variant: format!("cuda-{c}"),
            assets: vec![
                format!("llama-{v}-bin-ubuntu-cuda-{c}-x64.tar.gz"),
                format!("cudart-llama-{v}-bin-ubuntu-cuda-{c}-x64.tar.gz"),
            ],
            packages,
            binary: "llama-server".into(),
            cpu_flags: vec!["avx2"],
        });
    }
    Ok(Build {
        variant: "cpu".into(),
        assets: vec![format!("llama-{v}-bin-ubuntu-{arch}.tar.gz")],
        packages,
        binary: "llama-server".into(),
        cpu_flags: if arch == "x64" { vec!["avx2"] } else { vec![] },
    })
}

/// Whether a version may name a directory and a URL part: letters,
/// digits, `.`, `_`, `+` and `-`, not starting with a dot.
pub fn valid_version(v: &str) -> bool {
    !v.is_empty()
        && !v.starts_with('.')
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(arch: &str, driver: &str) -> Host {
        Host {
            os_id: "ubuntu".into(),
            arch: arch.into(),
            cpu_flags: vec!["avx2".into()],
            nvidia_driver: driver.into(),
            ..Host::default()
        }
    }

    #[test]
    fn the_build_follows_the_hardware() {
        let cpu = llamacpp("b1", &host("amd64", "")).unwrap();
        assert_eq!(
            (cpu.variant.as_str(), cpu.assets.clone()),
            ("cpu", vec!["llama-b1-bin-ubuntu-x64.tar.gz".to_string()])
        );
        let gpu = llamacpp("b1", &host("amd64", "570.86.15")).unwrap();
        assert_eq!(gpu.variant, "cuda-12.8");
        assert_eq!(gpu.assets.len(), 2, "the CUDA runtime comes along");
        assert!(gpu.assets[1].starts_with("cudart-"));
        let arm = llamacpp("b1", &host("arm64", "570.86.15")).unwrap();
        assert_eq!(arm.variant, "cpu", "arm64 GPU nodes get the CPU build");
        assert!(arm.cpu_flags.is_empty());
        assert_eq!(
            llamacpp("b1", &host("riscv64", "")).unwrap_err(),
            "llama.cpp publishes no Linux build for riscv64"
        );
        assert!(
            llamacpp("b1", &host("", ""))
                .unwrap_err()
                .contains("unrecognised")
        );
        assert!(choose("vllm", "0.29.0", &host("amd64", "")).is_none());
    }

    #[test]
    fn a_version_names_nothing_but_itself() {
        for ok in ["b10991", "1.2.3", "v0.4+cu128", "b1-rc_2"] {
            assert!(valid_version(ok), "{ok}");
        }
        for bad in ["", "..", "../x", "a/b", ".hidden", "b 1", "b1\n"] {
            assert!(!valid_version(bad), "{bad:?}");
        }
    }
}
