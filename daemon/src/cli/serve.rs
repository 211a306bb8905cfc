//! `kazeia serve`: the daemon on its Unix socket.

use kazeia_pipelines::Registry;

use super::{Exit, ServeArgs};
use crate::config::Config;

pub async fn serve(args: ServeArgs) -> Exit {
    let config = match Config::load(&args.common.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            return Exit::Usage;
        }
    };
    let registry = match registry(&args.common) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            return Exit::Usage;
        }
    };
    match crate::server::serve(config, registry, args.socket).await {
        Ok(()) => Exit::Ok,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            Exit::Failed
        }
    }
}

/// The built-in pipelines, plus `--pipelines DIR`.
pub fn registry(common: &super::CommonArgs) -> Result<Registry, kazeia_pipelines::PipelineError> {
    match &common.pipelines {
        Some(dir) => Registry::with_dir(dir),
        None => Ok(Registry::builtin()),
    }
}
