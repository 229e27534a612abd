from trainlab.cli import main

raise SystemExit(main())
