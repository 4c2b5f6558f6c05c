//! The control protocol between agents (and between a node's clients and its agent): versioned frames carrying
//! bincode messages. Being written (issue 4).
