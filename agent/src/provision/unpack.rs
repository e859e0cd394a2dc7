//! Unpacking a release archive (tar.gz) without trusting it: no entry is
//! written outside the install directory, by its name, through a link an
//! earlier entry made, or by a link of its own.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// `name` as a path inside the directory, judged by its text alone: an
/// absolute name, or one whose `..` climbs above the directory, is refused.
/// (Joining an absolute name onto a directory would replace the directory,
/// so names are never joined before they pass.)
pub fn within(name: &Path) -> Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for c in name.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(format!(
                        "{} would unpack outside the install directory",
                        name.display()
                    ));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "{} would unpack outside the install directory (an absolute name)",
                    name.display()
                ));
            }
        }
    }
    Ok(out)
}

/// Unpacks the gzipped tar at `archive` into `dir`.
///
/// Directories get 0755; files their mode less setuid, setgid, sticky and
/// group/other write; links are made only with a relative target that
/// stays inside; devices, FIFOs and hard links are skipped. Nothing is
/// written through a link: an entry whose parent is a link, or that would
/// replace one with a file, is refused.
pub fn tar_gz(archive: &Path, dir: &Path) -> Result<(), String> {
    let file = std::fs::File::open(archive).map_err(|e| e.to_string())?;
    unpack(flate2::read::GzDecoder::new(file), dir)
}

pub fn unpack(reader: impl Read, dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut tar = tar::Archive::new(reader);
    let entries = tar.entries().map_err(|e| e.to_string())?;
    for entry in entries {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let raw = entry.path().map_err(|e| e.to_string())?.into_owned();
        let rel = within(&raw)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        let target = dir.join(&rel);
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            make_dirs(dir, &rel)?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", raw.display()))?;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            if let Some(parent) = rel.parent() {
                make_dirs(dir, parent)?;
            }
            replaceable(&target, &raw)?;
            let mode = entry.header().mode().unwrap_or(0o644) & 0o755;
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&target)
                .map_err(|e| format!("{}: {e}", raw.display()))?;
            std::io::copy(&mut entry, &mut out).map_err(|e| format!("{}: {e}", raw.display()))?;
            out.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("{}: {e}", raw.display()))?;
        } else if kind.is_symlink() {
            let link = entry
                .link_name()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("{} is a link to nothing", raw.display()))?
                .into_owned();
            let outside = || format!("{} links outside the archive", raw.display());
            if link.is_absolute() {
                return Err(outside());
            }
            let from = rel.parent().unwrap_or(Path::new(""));
            within(&from.join(&link)).map_err(|_| outside())?;
            if let Some(parent) = rel.parent() {
                make_dirs(dir, parent)?;
            }
            replaceable(&target, &raw)?;
            std::os::unix::fs::symlink(&link, &target)
                .map_err(|e| format!("{}: {e}", raw.display()))?;
        }
        // Devices, FIFOs and hard links: nothing an engine build needs.
    }
    links_stay_inside(dir)
}

/// Creates `rel`'s directories under `dir`, refusing to pass through a
/// link (an earlier entry's) or a file.
fn make_dirs(dir: &Path, rel: &Path) -> Result<(), String> {
    let mut at = dir.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "{} is a link in the archive, and an entry would be written through it",
                    rel.display()
                ));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{} is a file, not a directory", at.display())),
            Err(_) => std::fs::create_dir(&at).map_err(|e| format!("{}: {e}", at.display()))?,
        }
    }
    Ok(())
}

/// An earlier entry at `target` is replaced (a later one in an archive
/// wins), but a directory is not.
fn replaceable(target: &Path, raw: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => Err(format!("{} replaces a directory", raw.display())),
        Ok(_) => std::fs::remove_file(target).map_err(|e| format!("{}: {e}", raw.display())),
        Err(_) => Ok(()),
    }
}

/// Every link, as the file system resolves it (through chains of links,
/// which the names alone cannot show), ends inside `dir`; a dangling link
/// is harmless and left.
fn links_stay_inside(dir: &Path) -> Result<(), String> {
    let root = dir.canonicalize().map_err(|e| e.to_string())?;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            let t = e.file_type().map_err(|e| e.to_string())?;
            let path = e.path();
            if t.is_dir() {
                stack.push(path);
            } else if t.is_symlink()
                && let Ok(real) = path.canonicalize()
                && !real.starts_with(&root)
            {
                let rel = path.strip_prefix(dir).unwrap_or(&path);
                return Err(format!("{} links outside the archive", rel.display()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_judged_before_they_are_joined() {
        assert_eq!(within(Path::new("a/./b/../c")).unwrap(), Path::new("a/c"));
        assert_eq!(within(Path::new("./")).unwrap(), Path::new(""));
        for bad in ["../x", "a/../../x", "/etc/passwd", ".."] {
            let e = within(Path::new(bad)).unwrap_err();
            assert!(e.contains("would unpack outside"), "{bad}: {e}");
        }
    }
}
