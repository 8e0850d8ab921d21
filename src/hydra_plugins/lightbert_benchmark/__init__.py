"""lightbert's benchmark sweeper, a Hydra plugin (Hydra instantiates sweepers from the hydra_plugins package only)."""
