from spark_consumer.cli import main

raise SystemExit(main())
