//! The figures of each `shoal bench ...`.
