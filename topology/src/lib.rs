//! Squall topology engine.
