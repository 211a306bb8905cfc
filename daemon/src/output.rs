//! Files a command writes at its end (a soak's plot and CSV, a spoken reply), checked before
//! it starts: a typo in `--plot` once cost a whole soak and its verdict.

use std::path::Path;

/// Whether `path` can take an output: its directory exists and the file opens for writing. A file this
/// creates is removed again; one that existed is left as it was (opened, not truncated).
pub fn check_writable(path: &Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a directory", dir.display())),
        Err(e) => return Err(format!("directory {}: {e}", dir.display())),
    }
    if path.is_dir() {
        return Err("it is a directory".into());
    }
    let existed = path.symlink_metadata().is_ok();
    std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(path).map_err(|e| e.to_string())?;
    if !existed {
        std::fs::remove_file(path).map_err(|e| format!("removing the test file: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_checked_without_leaving_files() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("m.png");
        check_writable(&new).unwrap();
        assert!(!new.exists(), "the check leaves no file behind");
        std::fs::write(&new, b"old").unwrap();
        check_writable(&new).unwrap();
        assert_eq!(std::fs::read(&new).unwrap(), b"old", "an existing file is left as it was");
        let missing = check_writable(&dir.path().join("no/such/m.png")).unwrap_err();
        assert!(missing.contains("no/such") && missing.contains("No such file"), "{missing}");
        let file_as_dir = check_writable(&new.join("m.png")).unwrap_err();
        assert!(file_as_dir.ends_with("is not a directory"), "{file_as_dir}");
        assert_eq!(check_writable(dir.path()).unwrap_err(), "it is a directory");
    }
}
