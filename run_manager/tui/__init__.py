"""The run-manager's Textual TUI (imported only when the TUI starts)."""
