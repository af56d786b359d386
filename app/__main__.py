from app.quick import main

raise SystemExit(main())
