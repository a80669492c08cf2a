"""The foundation every stage stands on: the spec file, atomic files, the one user-error type and how a
command ends on it, Bezier curves, the machine, plots, output folders and their locks, signals, the version.

Nothing here imports a stage (converter, exporters, validation, search) or the top (lpes/)."""
