"""`trainlab report`: one HTML + Markdown page (and, with --pdf, its PDF through headless Chromium) built
from run directories and result JSON files, or rebuilt from a `trainlab lab` folder as the lab's
hand-in (`report.lab`; the GPT ablation file's schema is documented in `report.ablation`)."""
