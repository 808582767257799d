"""Batches (OpenAI's Batch API, docs/api.md "Batches"): the batch record and its status machine (:mod:`.records`),
the driver that moves each batch along outside any request (:mod:`.driver`), the input lines (:mod:`.lines`), which
queue each line goes to (:mod:`.routing`), the output and error files (:mod:`.output`), and the file store they are
read from and written to (:mod:`.store`)."""
