"""The scaling policy (docs/operations.md "Scaling"): observations in, a desired count and its reason out, as pure
functions the scaler Lambda and the simulator (bench/) both run."""
