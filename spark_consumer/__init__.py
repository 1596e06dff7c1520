"""The Spark consumer of futoin-evt: the ``futoin-evt`` PySpark data source and the archive and
aggregate jobs built on it (``futoin-evt-spark``)."""
