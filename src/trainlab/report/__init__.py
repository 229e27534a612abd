"""`trainlab report`: one HTML + Markdown page built from run directories and result JSON files."""
