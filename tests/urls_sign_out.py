"""The demo's URLs, and a sign-out view that is async (``alogout``), as a site may write one."""

from django.contrib.auth import alogout
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.decorators.http import require_POST


@require_POST
async def async_logout(request: HttpRequest) -> HttpResponse:
    await alogout(request)
    return HttpResponse("signed out")


urlpatterns = [
    path("accounts/alogout/", async_logout),
    path("", include("project.urls")),
]
