"""Operator dashboard: server-rendered pages with Plotly figures built in Python.

Pages (all login-required): the cluster graph (`/`, `/clusters/NAME/`), the queue (`/queue/`),
a job (`/jobs/N/`) and, for staff, the topology import (`/import/`) and migration apply/reject.
Permissions follow the API: staff see every job; a user sees the details of their own jobs only.
Other users' jobs appear on the graph and in the queue as "job N (other user)" with status, GPU
count, age and pending reason, and their job pages are 404. MFU, utilisation, comm share and link
load are the cost model's predictions until measurements exist.
"""
