//! `dovetail crdgen`: writes the CustomResourceDefinitions of `dovetail-api` as YAML
//! (`deploy/crds/` is checked in; a test fails when it is stale).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CrdgenArgs {
    /// The directory to write `<group>_<plural>.yaml` into.
    #[arg(long, default_value = "deploy/crds")]
    pub out: PathBuf,
}

/// Writes every CRD into `dir`; returns the files written.
pub fn write(dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for (name, text) in dovetail_api::crd::manifests().map_err(|e| e.to_string())? {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

pub fn run(args: &CrdgenArgs) -> ExitCode {
    match write(&args.out) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
