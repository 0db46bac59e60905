"""fedtune."""
