"""Page-number pagination with a client-chosen page size, for every list endpoint."""

from django.db.models import QuerySet
from rest_framework.pagination import PageNumberPagination


class StandardPagination(PageNumberPagination):
    """?page=N&page_size=M (default 50, at most 500)."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class Rows:
    """The rows of `queryset` as `values_list(*columns)` reads them, counted on `queryset` itself:
    a list that reads its related rows' names (`cluster__name`) pages these, and its COUNT joins
    none of those tables (Django's COUNT of the values keeps every join they made, a cost that
    grows with the table). The columns' joins must not drop rows (foreign keys that are not null,
    or outer joins)."""

    def __init__(self, queryset: QuerySet, columns: tuple[str, ...]):
        self.queryset = queryset
        self.rows = queryset.values_list(*columns)

    def count(self) -> int:
        return self.queryset.count()

    def __getitem__(self, index):
        return self.rows[index]

    def __iter__(self):
        return iter(self.rows)
