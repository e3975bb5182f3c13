//! The endpoint's state file: `<data>/federation-state.json`, the job records and links
//! ([`Saved`]), written whole (temporary file, fsync, rename) before any effect of a change
//! leaves the process. Small by design: terminal jobs are capped (`keep_terminal`).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::site::Saved;

pub const FILE: &str = "federation-state.json";

pub use crate::error::StoreError;

#[derive(Debug, Clone)]
pub struct Store {
    path: PathBuf,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Dir(dir.to_path_buf(), e))?;
        Ok(Store { path: dir.join(FILE) })
    }

    /// The saved state of `site`, if any.
    pub fn load(&self, site: &str) -> Result<Option<Saved>, StoreError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::Read(self.path.clone(), e)),
        };
        let saved: Saved =
            serde_json::from_str(&text).map_err(|e| StoreError::Parse(self.path.clone(), e.to_string()))?;
        if saved.site != site {
            return Err(StoreError::Site(self.path.clone(), saved.site, site.to_string()));
        }
        Ok(Some(saved))
    }

    pub fn save(&self, saved: &Saved) -> Result<(), StoreError> {
        let tmp = self.path.with_extension("json.tmp");
        let err = |e| StoreError::Write(self.path.clone(), e);
        let bytes = serde_json::to_vec(saved).map_err(|e| err(std::io::Error::other(e)))?;
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&bytes).map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_wrong_site() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        assert!(s.load("a").unwrap().is_none());
        s.save(&Saved {
            site: "a".into(),
            jobs: vec![],
            links: vec![],
            removed: vec![],
            directories: Default::default(),
            told: Default::default(),
        })
        .unwrap();
        assert_eq!(s.load("a").unwrap().unwrap().site, "a");
        assert!(s.load("b").unwrap_err().to_string().contains("not \"b\""));
    }
}
