"""Tools for multi-turn rollouts (issue 34): the Tool interface, the per-rank tool worker, the sandbox, the built-in
tools and the tool-call formats. No torch (docs/tools.md)."""
