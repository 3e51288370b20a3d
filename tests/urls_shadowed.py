"""A site that maps chatstream's stream path to a view of its own, ahead of chatstream's URLs."""

from django.http import HttpResponse
from django.urls import include, path


def own_view(request, pk):
    return HttpResponse("the site's own view")


urlpatterns = [
    path("chat/g/<uuid:pk>/stream/", own_view),
    path("chat/", include("chatstream.urls")),
]
