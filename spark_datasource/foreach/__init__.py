"""The exactly-once ``foreachBatch`` helper: the calls users write (:mod:`.helper`), its options
(:mod:`.options`), one micro-batch's write under its key (:mod:`.write`), the collect of a micro-batch
to the driver (:mod:`.collect`) and which query and run a micro-batch comes from (:mod:`.query`)."""
