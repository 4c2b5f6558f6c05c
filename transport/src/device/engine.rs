//! The engines that move pages, and the choices a caller can name: which engine, and which GPU runs the kernel.
//!
//! They are a file of their own because both the movers and their errors name them.

use serde::{Deserialize, Serialize};

/// The engine that moves a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// DMA copy engines: one call per contiguous run (batched when there are many).
    CopyEngine,
    /// The SM gather/scatter copy kernel.
    SmKernel,
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::CopyEngine => "copy-engine",
            Engine::SmKernel => "sm-kernel",
        })
    }
}

/// Which engine a caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineChoice {
    /// The mover picks (`choose_engine` in the mover).
    #[default]
    Auto,
    /// Always the copy engine.
    CopyEngine,
    /// Always the SM kernel.
    SmKernel,
}

/// A name that is not an [`EngineChoice`] (`--engine` on the command line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an engine: use auto, copy or kernel")]
pub struct ParseEngineChoiceError(pub String);

impl std::str::FromStr for EngineChoice {
    type Err = ParseEngineChoiceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "copy" | "copy-engine" | "ce" => Ok(EngineChoice::CopyEngine),
            "kernel" | "sm" | "sm-kernel" => Ok(EngineChoice::SmKernel),
            _ => Err(ParseEngineChoiceError(s.to_string())),
        }
    }
}

impl std::fmt::Display for EngineChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineChoice::Auto => "auto",
            EngineChoice::CopyEngine => "copy",
            EngineChoice::SmKernel => "kernel",
        })
    }
}

/// Which GPU runs the kernel for a GPU-to-GPU move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelSide {
    /// Pull with 16 blocks or more, push with fewer (what the H200 sweep showed to be faster: docs/benchmarks.md).
    #[default]
    Auto,
    /// The destination GPU reads from the source (peer loads).
    Pull,
    /// The source GPU writes to the destination (peer stores).
    Push,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_choice_parses() {
        assert_eq!("copy".parse::<EngineChoice>(), Ok(EngineChoice::CopyEngine));
        assert_eq!("kernel".parse::<EngineChoice>(), Ok(EngineChoice::SmKernel));
        assert!("dma".parse::<EngineChoice>().is_err());
    }
}
