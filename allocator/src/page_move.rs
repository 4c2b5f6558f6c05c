//! One page to move between the frames of two arenas: what the directory plans and the movers carry out.

/// One page to move: from frame `src` of the source arena to frame `dst` of the destination arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageMove {
    /// Frame index in the source arena.
    pub src: u32,
    /// Frame index in the destination arena.
    pub dst: u32,
}
