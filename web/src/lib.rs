//! The pages (scaffold).
