"""``linattn sp-bench``: sequence parallelism on local gloo processes against one process, and a paper model of
many ranks (`bench`)."""
